import Synchronization

/// Thrown by ``withTimeout(_:scheduler:operation:)`` when the operation did not
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

/// Runs `operation`, and if it has not finished after `timeout`, cancels it and
/// throws ``TimeoutError``.
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
/// - The error is thrown at the deadline even if the operation ignores
///   cancellation: the operation runs in its own task, which is cancelled and left
///   to finish on its own; its late result is discarded.
/// - If the operation finishes first, its value is returned (or its error thrown)
///   and the deadline is cancelled at once.
/// - If the calling task is cancelled, the operation is cancelled too and its
///   outcome (usually `CancellationError`) is what `withTimeout` returns or throws.
/// - A zero or negative `timeout` throws as soon as the scheduler fires, unless
///   the operation finishes before; a timeout too long to represent never fires.
///
/// The deadline is kept by `scheduler`, so under a `ManualTimerScheduler` the
/// timeout happens exactly when the test advances past it.
public func withTimeout<Result: Sendable>(
    _ timeout: Duration,
    scheduler: any TimerScheduler = SystemTimerScheduler.shared,
    operation: @escaping @Sendable () async throws -> Result
) async throws -> Result {
    let race = TimeoutRace<Result>()
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { continuation in
            race.install(continuation)
            let task = Task {
                do {
                    race.finish(.success(try await operation()))
                } catch {
                    race.finish(.failure(error))
                }
            }
            let deadline = DelayedWork.schedule(after: timeout, scheduler: scheduler) {
                race.finish(.failure(TimeoutError(timeout: timeout)))
            }
            race.attach(task: task, deadline: deadline)
        }
    } onCancel: {
        race.cancelOperation()
    }
}

/// The shared state of one ``withTimeout(_:scheduler:operation:)`` call: whichever
/// of the operation and the deadline finishes first resumes the caller, once.
private final class TimeoutRace<Result: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<Result, any Error>?
        var task: Task<Void, Never>?
        var deadline: DelayedWork?
        var outcome: Swift.Result<Result, any Error>?
        var cancelRequested = false
    }

    private let state = StateLock(State())

    func install(_ continuation: CheckedContinuation<Result, any Error>) {
        state.withLock { $0.continuation = continuation }
    }

    func attach(task: Task<Void, Never>, deadline: DelayedWork) {
        let (finished, cancel) = state.withLock { state -> (Bool, Bool) in
            if state.outcome == nil {
                state.task = task
                state.deadline = deadline
            }
            return (state.outcome != nil, state.cancelRequested)
        }
        if finished {
            task.cancel()
            deadline.cancel(waitingForRun: false)
        } else if cancel {
            task.cancel()
        }
    }

    func finish(_ outcome: Swift.Result<Result, any Error>) {
        let taken = state.withLock {
            state -> (CheckedContinuation<Result, any Error>, Task<Void, Never>?, DelayedWork?)? in
            guard state.outcome == nil, let continuation = state.continuation else { return nil }
            state.outcome = outcome
            state.continuation = nil
            defer {
                state.task = nil
                state.deadline = nil
            }
            return (continuation, state.task, state.deadline)
        }
        guard let (continuation, task, deadline) = taken else { return }
        if case .failure(let error) = outcome, error is TimeoutError { task?.cancel() }
        deadline?.cancel(waitingForRun: false)
        continuation.resume(with: outcome)
    }

    func cancelOperation() {
        let task = state.withLock { state -> Task<Void, Never>? in
            state.cancelRequested = true
            return state.task
        }
        task?.cancel()
    }
}
