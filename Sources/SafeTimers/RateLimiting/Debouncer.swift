import Dispatch
import Synchronization

/// Runs only the last of a burst of calls, once the calls have stopped for `delay`.
///
/// ```swift
/// let debouncer = Debouncer(delay: .milliseconds(300), queue: .main)
/// func searchFieldChanged(_ query: String) {
///     debouncer.call { search(query) }   // runs once, 300 ms after the last keystroke
/// }
/// ```
///
/// Semantics (trailing edge, and optionally leading):
/// - Each ``call(_:)`` replaces the pending action (the replaced one is released at
///   once) and moves the deadline to *now + delay*. A run that was due but has not
///   begun yet is called off too: the quiet period starts again.
/// - When the deadline passes, the latest action runs once on `queue`.
/// - With `leading: true`, the first call of a burst runs at once too (right
///   after the running action, if one runs); the latest call runs at the end of
///   the quiet period only if calls came after the first (a lone call runs once).
/// - Actions never overlap: if the deadline passes while an earlier action still
///   runs, the new one begins right after it returns.
/// - ``flush()`` runs the pending action now instead of at its deadline.
/// - ``cancel()`` drops the pending action; once it returns, no action of this
///   debouncer is running on another thread, and none begins until the next
///   ``call(_:)``.
/// - Releasing the debouncer cancels it.
///
/// A zero or negative `delay` runs each action as soon as possible (calls still
/// replace an action that has not begun yet); a delay too long to represent
/// means the action waits for ``flush()`` or is dropped by the next call.
///
/// Thread safety: every member may be used from any thread, including from
/// inside an action.
public final class Debouncer: Sendable {
    private let core: DebouncerCore

    /// Creates a debouncer.
    ///
    /// - Parameters:
    ///   - delay: How long calls must stop before the last one runs.
    ///   - leading: Also run the first call of each burst at once (the latest
    ///     still runs at the end if more calls came). Default: false.
    ///   - queue: Where actions run (under a manual scheduler: inside `advance(by:)`).
    ///   - scheduler: The scheduler that keeps the deadline; `nil` (the default)
    ///     is ``SystemTimerScheduler/shared``.
    public init(
        delay: Duration,
        leading: Bool = false,
        queue: DispatchQueue = .global(),
        scheduler: (any TimerScheduler)? = nil
    ) {
        core = DebouncerCore(delay: delay, leading: leading, executor: .queue(queue), engine: TimerEngine.of(scheduler))
    }

    /// Creates a debouncer whose actions run on a Swift executor.
    ///
    /// `executor` is where each action runs: a Swift executor, such as a SwiftNIO event loop's `executor`, an
    /// actor's custom executor, or a `TaskExecutor`. Each delivery starts a task whose one job is enqueued
    /// directly on `executor` (no dispatch queue in between); handlers due together for the same executor
    /// object share a task per 16, enqueued in deadline order (so they run in that order on an executor that
    /// runs its jobs in the order they come, as event loops and actors do). Under a `ManualTimerScheduler`
    /// each action runs inside `advance(by:)` instead. The primitive keeps `executor` alive for as long as it
    /// exists, as it keeps a queue.
    ///
    /// Everything else is as in ``init(delay:leading:queue:scheduler:)``.
    public init(
        delay: Duration,
        leading: Bool = false,
        executor: any Executor,
        scheduler: (any TimerScheduler)? = nil
    ) {
        core = DebouncerCore(
            delay: delay, leading: leading, executor: .onExecutor(executor), engine: TimerEngine.of(scheduler))
    }

    deinit {
        core.cancel()
    }

    /// Replaces the pending action with `action`, to run `delay` after this call
    /// unless another call comes first.
    ///
    /// - Complexity: O(1) in the number of pending timers.
    public func call(_ action: @escaping @Sendable () -> Void) {
        core.call(RateLimitedAction(run: action, onMainActor: false))
    }

    /// Like ``call(_:)``, for an action that runs on the main actor (whatever
    /// `queue` the debouncer was given).
    ///
    /// ```swift
    /// debouncer.call { @MainActor in resultsView.show(search(query)) }
    /// ```
    ///
    /// The `isolation` parameter only tells this overload apart from
    /// ``call(_:)``; leave it out.
    public func call(isolation: MainActor.Type = MainActor.self, _ action: @escaping @MainActor @Sendable () -> Void) {
        core.call(RateLimitedAction(run: HandlerExecutor.adapt(action), onMainActor: true))
    }

    /// Runs the pending action now (on `queue`), if there is one, instead of at
    /// its deadline. If an earlier action is still running, the pending one
    /// begins right after it returns. Nothing calls a flushed action off but
    /// ``cancel()``. A flush ends the burst: with `leading: true`, the next call
    /// runs at once.
    public func flush() { core.flush() }

    /// Drops the pending action, if any. Once it returns, no action of this
    /// debouncer is running on another thread (if one was, `cancel()` waited for
    /// it), and none begins until the next ``call(_:)``. Called from inside an
    /// action, it returns at once.
    public func cancel() { core.cancel() }

    /// The storage (tests).
    var storageForTesting: DebouncerCore { core }
}

/// The storage of a ``Debouncer``: what the engine keeps while a call waits.
/// `@unchecked Sendable` invariant (the base class ``TimerEntry`` makes the
/// compiler leave it to us): every stored property is a `let` of a `Sendable`
/// type (the lock that guards the machine, atomics, the executor, the engine).
final class DebouncerCore: TimerEntry, ClosureInvoking, @unchecked Sendable {
    let delay: Duration
    let storage: StateLock<LockedMachine<DebouncerStateMachine>>
    let executor: HandlerExecutor
    let engine: TimerEngine

    init(delay: Duration, leading: Bool = false, executor: HandlerExecutor, engine: TimerEngine) {
        self.delay = delay
        self.storage = StateLock(LockedMachine(machine: DebouncerStateMachine(leading: leading)))
        self.executor = executor
        self.engine = engine
    }

    func call(_ action: RateLimitedAction) {
        let deadline = DeadlineArithmetic.deadline(now: engine.nowTicks, after: delay)
        complete(transition { $0.call(action, deadline: deadline) })
    }

    func flush() { complete(transition { $0.flush() }) }

    func cancel(thread: UInt = ThreadIdentity.current()) {
        complete(transition { $0.cancel(thread: thread) })
    }

    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        fired(sequence: sequence) { $0.deadlinePassed() }
    }

    func begin(tag: UInt64, thread: UInt) -> (@Sendable () -> Void)? {
        storage.withLock { $0.machine.begin(tag: tag, thread: thread) }?.run
    }

    func end() { complete(transition { $0.end() }) }
}
