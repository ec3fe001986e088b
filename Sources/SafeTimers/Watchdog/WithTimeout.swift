import Synchronization

/// Thrown by ``withTimeout(_:scheduler:isolation:operation:)`` when the operation did not
/// finish in time.
///
/// An extensible error: match it by type (`catch let error as TimeoutError`) and
/// read its properties; more may be added.
public struct TimeoutError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The time limit that was exceeded.
    public let timeout: Duration

    /// Creates an error for the given time limit.
    public init(timeout: Duration) {
        self.timeout = timeout
    }

    /// A sentence naming the limit.
    public var description: String {
        "TimeoutError: the operation did not finish within \(timeout)"
    }
}

/// Runs `operation` with a time limit: if it has not finished after `timeout`,
/// it is cancelled, and `withTimeout` waits for it to finish.
///
/// ```swift
/// do {
///     let profile = try await withTimeout(.seconds(1)) { try await api.fetchProfile() }
///     show(profile)
/// } catch is TimeoutError {
///     showOfflineBanner()
/// }
/// ```
///
/// Structured, like `withTaskGroup`: when `withTimeout` returns or throws, the
/// operation has finished. The operation runs as a child task; at the deadline it
/// is cancelled and awaited, so an operation that ignores cancellation delays
/// the return until it finishes. The operation's outcome decides:
/// - a value is returned, even one returned after the deadline (the work was
///   done; nothing is gained by throwing it away);
/// - an error thrown before the deadline passed is rethrown as is;
/// - an error thrown after the deadline passed (usually the `CancellationError`
///   that the cancellation caused) becomes ``TimeoutError``.
///
/// An operation that has finished when the deadline is processed always wins,
/// so `withTimeout(.zero) { 1 }` returns 1. If the calling task is cancelled, the
/// operation is cancelled too and its outcome is returned or thrown as is. A
/// zero or negative `timeout` cancels the operation as soon as the scheduler
/// fires; a timeout too long to represent never fires.
///
/// The deadline is kept by `scheduler`, so under a `ManualTimerScheduler` the
/// timeout happens exactly when the test advances past it (once the deadline is
/// armed: `pendingCount` tells).
///
/// - Parameters:
///   - timeout: The time limit.
///   - scheduler: The scheduler that keeps the deadline.
///   - isolation: The caller's isolation, inherited by the task group, so
///     calling `withTimeout` does not hop away from the caller's actor.
///   - operation: The work to limit; it runs in a child task.
public func withTimeout<Result: Sendable>(
    _ timeout: Duration,
    scheduler: any TimerScheduler = SystemTimerScheduler.shared,
    isolation: isolated (any Actor)? = #isolation,
    operation: @escaping @Sendable () async throws -> Result
) async throws -> Result {
    let race = DeadlineRace()
    let engine = scheduler.engine
    let outcome = await withTaskGroup(
        of: TimeoutEvent<Result>.self, returning: Swift.Result<Result, any Error>.self, isolation: isolation
    ) { group in
        group.addTask {
            do {
                let value = try await operation()
                _ = race.operationFinished()
                return .operation(.success(value))
            } catch {
                let beforeDeadline = race.operationFinished()
                return .operation(.failure(beforeDeadline ? error : TimeoutError(timeout: timeout)))
            }
        }
        group.addTask {
            guard (try? await sleep(on: engine, for: timeout)) != nil else { return .deadlineCancelled }
            return race.deadlinePassed() ? .deadlinePassed : .deadlineCancelled
        }
        while let event = await group.next() {
            switch event {
            case .operation(let result):
                group.cancelAll()  // the deadline's sleep: frees its entry at once
                return result
            case .deadlinePassed:
                group.cancelAll()  // the operation; its outcome still comes through `next()`
            case .deadlineCancelled:
                continue
            }
        }
        return .failure(CancellationError())  // unreachable: the operation always reports
    }
    return try outcome.get()
}

/// What a child task of ``withTimeout(_:scheduler:isolation:operation:)`` reports.
private enum TimeoutEvent<Success: Sendable>: Sendable {
    case operation(Swift.Result<Success, any Error>)
    case deadlinePassed
    case deadlineCancelled
}

/// Which of the operation and the deadline finished first: decided once, by one
/// atomic compare-and-exchange, so an operation that has finished when the
/// deadline is processed always wins.
private final class DeadlineRace: Sendable {
    private static let running: UInt8 = 0
    private static let finished: UInt8 = 1
    private static let expired: UInt8 = 2
    private let state = Atomic<UInt8>(DeadlineRace.running)

    /// The operation finished; returns false if the deadline had passed first.
    func operationFinished() -> Bool {
        state.compareExchange(expected: Self.running, desired: Self.finished, ordering: .acquiringAndReleasing)
            .exchanged
    }

    /// The deadline passed; returns false if the operation had finished first.
    func deadlinePassed() -> Bool {
        state.compareExchange(expected: Self.running, desired: Self.expired, ordering: .acquiringAndReleasing)
            .exchanged
    }
}

/// Suspends the current task for `delay` on `engine`'s clock; throws
/// `CancellationError` (and frees the engine entry at once) when the task is
/// cancelled first.
func sleep(on engine: TimerEngine, for delay: Duration) async throws {
    let sleeper = Sleeper()
    try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            sleeper.begin(continuation, engine: engine, delay: delay)
        }
    } onCancel: {
        sleeper.cancel()
    }
}

/// One suspended ``sleep(on:for:)``: the continuation and its deadline, resumed
/// exactly once by whichever of the deadline and the cancellation comes first.
private final class Sleeper: Sendable {
    private struct State {
        var continuation: CheckedContinuation<Void, any Error>?
        var work: DelayedWork?
        var cancelled = false
    }

    private let state = StateLock(State())

    func begin(_ continuation: CheckedContinuation<Void, any Error>, engine: TimerEngine, delay: Duration) {
        let cancelledAlready = state.withLock { state -> Bool in
            if !state.cancelled { state.continuation = continuation }
            return state.cancelled
        }
        if cancelledAlready {
            continuation.resume(throwing: CancellationError())
            return
        }
        let work = DelayedWork.schedule(
            atTicks: { DeadlineArithmetic.deadline(now: $0.nowTicks, after: delay) }, executor: .queue(.global()),
            engine: engine
        ) { [self] in self.finish(with: .success(())) }
        let cancelledMeanwhile = state.withLock { state -> Bool in
            if !state.cancelled { state.work = work }
            return state.cancelled
        }
        if cancelledMeanwhile { work.cancel() }
    }

    func cancel() {
        let work = state.withLock { state -> DelayedWork? in
            state.cancelled = true
            defer { state.work = nil }
            return state.work
        }
        work?.cancel(waitingForRun: false)
        finish(with: .failure(CancellationError()))
    }

    private func finish(with result: Swift.Result<Void, any Error>) {
        let continuation = state.withLock { state in
            defer { state.continuation = nil }
            return state.continuation
        }
        continuation?.resume(with: result)
    }
}
