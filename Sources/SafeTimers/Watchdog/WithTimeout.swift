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
/// operation has finished. The operation runs as a child task; at the deadline (decided where
/// the engine fires its timers, on its own thread, even while Swift's cooperative pool is busy) it
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
/// The operation may be non-escaping and not `Sendable`: a server
/// middleware's `next`, a closure capturing the caller's non-`Sendable` state.
/// The deadline cancels only the operation's child task, never the caller:
///
/// ```swift
/// func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response)
///     async throws -> Response
/// {
///     do {
///         return try await withTimeout(.seconds(5)) { try await next(request, context) }
///     } catch is TimeoutError {
///         return Response(status: .gatewayTimeout)
///     }
/// }
/// ```
///
/// The operation runs in the caller's isolation, as it would inline: it is
/// `nonisolated(nonsending)`, and its child task runs it on `isolation`. In an
/// actor's method it runs on that actor (on the actor's executor, a custom one
/// too) whether or not it names `self`, so it may touch what the actor's code
/// may touch; in a nonisolated function it runs on the global executor. That is
/// safe because the caller is suspended in `withTimeout` for as long as the
/// operation runs, and the operation runs where the caller's own code would.
/// An operation that must not run on the caller's actor says so:
/// `withTimeout(.seconds(1)) { @concurrent in try await crunch() }`.
///
/// The deadline is kept by `scheduler`, so under a `ManualTimerScheduler` the
/// timeout happens exactly when the test advances past it (once the deadline is
/// armed: `pendingCount` tells).
///
/// - Parameters:
///   - timeout: The time limit.
///   - scheduler: The scheduler that keeps the deadline; `nil` (the default) is
///     ``SystemTimerScheduler/shared``.
///   - isolation: The caller's isolation: the operation runs there, and
///     calling `withTimeout` does not hop away from the caller's actor.
///   - operation: The work to limit; it runs in a child task, in the caller's
///     isolation, and need not be escaping or `Sendable`.
public func withTimeout<Result: Sendable>(
    _ timeout: Duration,
    scheduler: (any TimerScheduler)? = nil,
    isolation: isolated (any Actor)? = #isolation,
    operation: nonisolated(nonsending) () async throws -> Result
) async throws -> Result {
    let engine = TimerEngine.of(scheduler)
    let deadline = DeadlineArithmetic.deadline(now: engine.nowTicks, after: timeout)
    return try await withDeadline(deadline, timeout: timeout, engine: engine, operation: operation)
}

/// Runs `operation` with a deadline: an instant of `scheduler`'s
/// ``TimerScheduler/clock``. Exactly as ``withTimeout(_:scheduler:isolation:operation:)``,
/// with a point in time instead of a duration; the ``TimeoutError`` it throws
/// carries the time from the call to the deadline.
///
/// ```swift
/// let deadline = SystemTimerScheduler.shared.clock.now.advanced(by: .seconds(2))
/// let first = try await withTimeout(until: deadline) { try await fetchFirstPage() }
/// let second = try await withTimeout(until: deadline) { try await fetchSecondPage() }   // same budget
/// ```
public func withTimeout<Result: Sendable>(
    until deadline: TimerClock.Instant,
    scheduler: (any TimerScheduler)? = nil,
    isolation: isolated (any Actor)? = #isolation,
    operation: nonisolated(nonsending) () async throws -> Result
) async throws -> Result {
    let engine = TimerEngine.of(scheduler)
    let timeout = Duration.nanoseconds(max(0, Int128(deadline.ticks) - Int128(engine.nowTicks)))
    return try await withDeadline(deadline.ticks, timeout: timeout, engine: engine, operation: operation)
}

/// The body of both `withTimeout` forms: `deadline` in engine ticks. The
/// non-escaping `operation` is handed to the child task through an
/// ``OperationHandoff``, emptied before this returns; the child task runs it on
/// `isolation`.
private func withDeadline<Result: Sendable>(
    _ deadline: Int64,
    timeout: Duration,
    engine: TimerEngine,
    isolation: isolated (any Actor)? = #isolation,
    operation: nonisolated(nonsending) () async throws -> Result
) async throws -> Result {
    try await withoutActuallyEscaping(operation) { escapable in
        _ = isolation  // this closure runs where the caller runs
        let handoff = OperationHandoff(escapable)
        // The child task has returned by now (the group awaits it), but the task
        // may release what its closure captured a little later: emptying the
        // handoff is what leaves the closure unescaped.
        defer { handoff.empty() }
        let caller = isolation
        return try await race(deadline, timeout: timeout, engine: engine) { try await handoff.run(on: caller) }
    }
}

/// Runs `operation` in a child task that a ``TimeoutDeadline`` cancels at
/// `deadline`; see ``withTimeout(_:scheduler:isolation:operation:)`` for the
/// outcome rules.
private func race<Result: Sendable>(
    _ deadline: Int64,
    timeout: Duration,
    engine: TimerEngine,
    isolation: isolated (any Actor)? = #isolation,
    operation: @escaping @Sendable () async throws -> Result
) async throws -> Result {
    let expiry = TimeoutDeadline()
    engine.arm(expiry, at: deadline)
    let outcome = await withTaskGroup(
        of: Swift.Result<Result, any Error>.self, returning: Swift.Result<Result, any Error>.self,
        isolation: isolation
    ) { group in
        group.addTask {
            expiry.enter()
            defer { expiry.leave() }
            do {
                let value = try await operation()
                _ = expiry.operationFinished()
                return .success(value)
            } catch {
                let beforeDeadline = expiry.operationFinished()
                return .failure(beforeDeadline ? error : TimeoutError(timeout: timeout))
            }
        }
        return await group.next() ?? .failure(CancellationError())  // `next()` always has the one result
    }
    engine.disarm(expiry)
    return try outcome.get()
}

/// The deadline of a `withTimeout` call: an engine entry that, when it fires,
/// decides the race with the operation (one atomic compare-and-exchange, so an
/// operation that has finished when the deadline is processed always wins) and,
/// if the deadline won, cancels the task that runs the operation.
///
/// It fires where the engine fires its entries, on the scheduler thread (inside
/// `advance(by:)` under virtual time): not in a task of its own, which would need
/// a thread of Swift's cooperative pool (busy, perhaps, with the very work that
/// is late), nor on a dispatch queue, whose threads the same CPU starvation holds
/// back on Linux. A cancel that comes before the task has entered cancels it as
/// it enters.
///
/// `@unchecked Sendable` invariant: the task reference is read and written only
/// under the lock, and is held only between ``enter()`` and ``leave()``, which
/// the task itself calls around its work; so the cancel (made under the lock,
/// which runs the operation's cancellation handlers there, on the scheduler
/// thread: they must be quick, as Swift asks) never touches a finished task.
private final class TimeoutDeadline: TimerEntry, @unchecked Sendable {
    private static let running: UInt8 = 0
    private static let finished: UInt8 = 1
    private static let expired: UInt8 = 2

    private struct State {
        var task: TaskReference?
        var cancelled = false
    }

    /// The task, carried across threads under the invariant above.
    private struct TaskReference: @unchecked Sendable {
        let task: UnsafeCurrentTask
    }

    private let outcome = Atomic<UInt8>(TimeoutDeadline.running)
    private let state = StateLock(State())

    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        let passed = outcome.compareExchange(
            expected: Self.running, desired: Self.expired, ordering: .acquiringAndReleasing
        ).exchanged
        guard passed else { return }
        state.withLock { state in
            state.cancelled = true
            state.task?.task.cancel()
        }
    }

    /// The operation finished; returns false if the deadline had passed first.
    func operationFinished() -> Bool {
        outcome.compareExchange(expected: Self.running, desired: Self.finished, ordering: .acquiringAndReleasing)
            .exchanged
    }

    /// The task that runs the operation begins.
    func enter() {
        withUnsafeCurrentTask { task in
            guard let task else { return }
            let reference = TaskReference(task: task)
            let cancelNow = state.withLock { state in
                state.task = reference
                return state.cancelled
            }
            if cancelNow { task.cancel() }
        }
    }

    /// The task that runs the operation is done with it.
    func leave() {
        state.withLock { $0.task = nil }
    }
}

/// The operation of a `withTimeout` call, handed from the caller to the child
/// task that runs it, in the caller's isolation.
///
/// `@unchecked Sendable` invariant: the closure is called once, by the child
/// task, on the caller's actor (``run(on:)`` is isolated to it) or, for a
/// nonisolated caller, on the global executor, while the caller is suspended in
/// `withTimeout` awaiting that task; so nothing else touches what it captures
/// meanwhile, and what it captures is touched only where the caller's own code
/// would touch it. The caller empties the handoff only after the child task has
/// returned.
private final class OperationHandoff<Result>: @unchecked Sendable {
    private var operation: (nonisolated(nonsending) () async throws -> Result)?

    init(_ operation: nonisolated(nonsending) @escaping () async throws -> Result) {
        self.operation = operation
    }

    /// Runs the operation on `caller`: a `nonisolated(nonsending)` closure runs
    /// in the isolation of the function that calls it, this one.
    func run(on caller: isolated (any Actor)?) async throws -> Result {
        guard let operation else { preconditionFailure("the operation of a withTimeout call ran twice") }
        return try await operation()
    }

    func empty() {
        operation = nil
    }
}
