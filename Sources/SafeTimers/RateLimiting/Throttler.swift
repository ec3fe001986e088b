import Dispatch
import Synchronization

/// Runs actions at most once per `interval`, keeping one call of each window
/// for the window's end.
///
/// ```swift
/// let throttler = Throttler(interval: .seconds(1))
/// func documentChanged() {
///     throttler.call { save() }   // at most one save a second, and the last edit is saved
/// }
/// ```
///
/// Semantics (leading and trailing edge):
/// - A window is `interval` long and starts when a run *begins*.
/// - A call when no window is open and nothing runs is run as soon as possible
///   (on `queue`).
/// - Other calls are kept for the end of the window: by default the latest call
///   replaces the kept one (`latest: true`); with `latest: false` the first call
///   is kept and later ones are dropped. A dropped action is released at once.
///   When the window ends, the kept call runs and opens the next window.
/// - So runs begin at least `interval` apart, never overlap (a run never begins
///   while the previous one still runs), and the last call of a burst always runs.
/// - ``cancel()`` drops the kept call; once it returns, no action of this
///   throttler is running on another thread, and none begins until the next
///   ``call(_:)``. The window since the last run still applies to that call.
/// - Releasing the throttler cancels it.
///
/// A zero or negative `interval` means no throttling beyond "no overlap": a call
/// runs as soon as possible, or right after the running action returns (calls
/// made meanwhile are merged as above). An interval too long to represent means
/// only the first call ever runs.
///
/// Thread safety: every member may be used from any thread, including from
/// inside an action.
public final class Throttler: Sendable {
    private let core: ThrottlerCore

    /// Creates a throttler.
    ///
    /// - Parameters:
    ///   - interval: The least time between the beginnings of two runs.
    ///   - latest: Which call of a window runs at its end: the latest (the
    ///     default) or the first.
    ///   - queue: Where actions run (under a manual scheduler: inside `advance(by:)`).
    ///   - scheduler: The scheduler that keeps the windows; `nil` (the default)
    ///     is ``SystemTimerScheduler/shared``.
    public init(
        interval: Duration,
        latest: Bool = true,
        queue: DispatchQueue = .global(),
        scheduler: (any TimerScheduler)? = nil
    ) {
        core = ThrottlerCore(
            interval: interval, latest: latest, executor: .queue(queue), engine: TimerEngine.of(scheduler))
    }

    /// Creates a throttler whose actions run on a Swift executor.
    ///
    /// `executor` is where each action runs: a Swift executor, such as a SwiftNIO event loop's `executor`, an
    /// actor's custom executor, or a `TaskExecutor`. Each delivery starts a task whose one job is enqueued
    /// directly on `executor` (no dispatch queue in between); handlers due together for the same executor
    /// object share a task per 16, enqueued in deadline order (so they run in that order on an executor that
    /// runs its jobs in the order they come, as event loops and actors do). Under a `ManualTimerScheduler`
    /// each action runs inside `advance(by:)` instead. The primitive keeps `executor` alive for as long as it
    /// exists, as it keeps a queue.
    ///
    /// Everything else is as in ``init(interval:latest:queue:scheduler:)``.
    public convenience init(
        interval: Duration,
        latest: Bool = true,
        executor: any Executor,
        scheduler: (any TimerScheduler)? = nil
    ) {
        self.init(interval: interval, latest: latest, executor: .onExecutor(executor), scheduler: scheduler)
    }

    init(interval: Duration, latest: Bool, executor: HandlerExecutor, scheduler: (any TimerScheduler)?) {
        core = ThrottlerCore(interval: interval, latest: latest, executor: executor, engine: TimerEngine.of(scheduler))
    }

    deinit {
        core.cancel()
    }

    /// Runs `action` as soon as possible if no window is open, otherwise keeps it
    /// for the end of the window (see the type's discussion for which call is kept).
    ///
    /// - Complexity: O(1) in the number of pending timers.
    public func call(_ action: @escaping @Sendable () -> Void) {
        core.call(RateLimitedAction(run: action, onMainActor: false))
    }

    /// Like ``call(_:)``, for an action that runs on the main actor (whatever
    /// `queue` the throttler was given).
    ///
    /// ```swift
    /// throttler.call { @MainActor in progressView.update(progress) }
    /// ```
    ///
    /// The `isolation` parameter only tells this overload apart from
    /// ``call(_:)``; leave it out.
    public func call(isolation: MainActor.Type = MainActor.self, _ action: @escaping @MainActor @Sendable () -> Void) {
        core.call(RateLimitedAction(run: HandlerExecutor.adapt(action), onMainActor: true))
    }

    /// Drops the kept call. Once it returns, no action of this throttler is
    /// running on another thread (if one was, `cancel()` waited for it), and none
    /// begins until the next ``call(_:)``. Called from inside an action, it
    /// returns at once.
    public func cancel() { core.cancel() }

    /// The storage (tests).
    var storageForTesting: ThrottlerCore { core }
}

/// The storage of a ``Throttler``: what the engine keeps while a window is open.
/// `@unchecked Sendable` invariant (the base class ``TimerEntry`` makes the
/// compiler leave it to us): every stored property is a `let` of a `Sendable`
/// type (the lock that guards the machine, atomics, the executor, the engine).
final class ThrottlerCore: TimerEntry, ClosureInvoking, @unchecked Sendable {
    let storage: StateLock<LockedMachine<ThrottlerStateMachine>>
    let executor: HandlerExecutor
    let engine: TimerEngine

    init(interval: Duration, latest: Bool, executor: HandlerExecutor, engine: TimerEngine) {
        self.executor = executor
        self.engine = engine
        let machine = ThrottlerStateMachine(
            interval: DeadlineArithmetic.delayNanoseconds(interval), keepsLatest: latest)
        storage = StateLock(LockedMachine(machine: machine))
    }

    func call(_ action: RateLimitedAction) {
        let now = engine.nowTicks
        complete(transition { $0.call(action, now: now) })
    }

    func cancel(thread: UInt = ThreadIdentity.current()) {
        complete(transition { $0.cancel(thread: thread) })
    }

    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        let now = engine.nowTicks
        fired(sequence: sequence) { $0.deadlinePassed(now: now) }
    }

    func begin(tag: UInt64, thread: UInt) -> (@Sendable () -> Void)? {
        let now = engine.nowTicks
        return storage.withLock { $0.machine.begin(tag: tag, thread: thread, now: now) }?.run
    }

    func end() {
        let now = engine.nowTicks
        complete(transition { $0.end(now: now) })
    }
}
