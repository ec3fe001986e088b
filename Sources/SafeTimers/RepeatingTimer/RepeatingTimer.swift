import Dispatch

/// A repeating timer behind a complete state machine: every call, in every order,
/// from any thread, is safe.
///
/// ```swift
/// let timer = RepeatingTimer(interval: .seconds(30)) { sendEvents() }   // .idle
/// timer.start()      // .running: first tick 30 s from now
/// timer.suspend()    // .suspended
/// timer.resume()     // .running: next tick 30 s after resume
/// timer.cancel()     // .cancelled: once it returns, the handler never begins again
/// timer.start()      // restart after cancel is allowed
/// ```
///
/// What `DispatchSourceTimer` gets wrong and this does not:
/// - No call traps. A call that makes no sense in the current state (resume while
///   running, suspend twice, start while running, anything after cancel except
///   start) is a no-op. Releasing the timer in any state cancels it.
/// - ``cancel()`` is a barrier: once it returns, on any thread, the handler never
///   begins again; if the handler was running on another thread, `cancel()` waits
///   for it to return. Called from inside the handler it returns at once.
/// - Ticks stay on the grid *start + k × interval*: the next deadline is computed
///   from the previous deadline, not from "now", so the timer does not drift. What
///   happens to ticks missed while the handler or the machine was behind is your
///   choice: ``MissedTickPolicy``.
/// - The handler never overlaps itself: at most one invocation is queued or
///   running at a time, whatever is called meanwhile (a `suspend()`/`resume()`
///   or a `cancel()`/`start()` while the handler runs included); ticks that fall
///   due while it runs are owed per ``MissedTickPolicy``.
/// - A leeway larger than half the interval is reduced to half the interval, as
///   GCD does.
///
/// ## Bad input
/// - An `interval` below ``minimumInterval`` (including zero and negative ones) is
///   raised to ``minimumInterval``: the timer works, slowly enough that it cannot
///   become a busy loop. ``interval`` tells the interval in effect.
/// - An `interval` too long to represent (`.seconds(Int64.max)`) means the timer
///   runs but never ticks (except the first tick with `firesImmediately`).
/// - `repetitions` of zero or less: `start()` moves straight to ``TimerState/finished``
///   without calling the handler.
///
/// Thread safety: every member may be used from any thread, including from
/// inside the handler.
public final class RepeatingTimer: Sendable {
    /// One handler invocation, as seen by ``ticks``.
    public struct Tick: Sendable, Hashable {
        /// 1 for the first invocation after `start()`, then 2, 3, ….
        public let number: Int
        /// The scheduler's time when the invocation began (see ``TimerScheduler/now``).
        public let time: Duration
    }

    /// The shortest interval a timer uses; shorter ones are raised to it.
    public static let minimumInterval = Duration.milliseconds(1)

    /// How many ticks a ``ticks`` stream keeps for a slow consumer; older ones are
    /// dropped.
    public static let tickBufferSize = 16

    private let core: RepeatingTimerCore

    /// Creates a timer in the ``TimerState/idle`` state; call ``start()`` to run it.
    ///
    /// - Parameters:
    ///   - interval: Time between ticks; at least ``minimumInterval``.
    ///   - leeway: How late a tick may fire so that the scheduler can serve several
    ///     timers with one wake-up. Default: zero (on time).
    ///   - repetitions: How many times the handler runs before the timer is
    ///     ``TimerState/finished``; `nil` (the default) for forever.
    ///   - firesImmediately: Run the handler at `start()` (the first tick) instead of
    ///     one interval later. Default: false.
    ///   - missedTicks: What to do with ticks missed while the handler or the machine
    ///     was behind. Default: ``MissedTickPolicy/coalesce``.
    ///   - queue: Where the handler runs. Under a `ManualTimerScheduler` it runs
    ///     inside `advance(by:)` (an immediate first tick in the next advance).
    ///   - scheduler: The scheduler that keeps the deadlines; `nil` (the default)
    ///     is ``SystemTimerScheduler/shared``. The timer keeps its engine, so
    ///     releasing the scheduler never stops the timer.
    ///   - handler: Called on each tick, never twice at once. Kept until the
    ///     timer is released (not at `cancel()`: `start()` may run it again).
    public convenience init(
        interval: Duration,
        leeway: Duration = .zero,
        repetitions: Int? = nil,
        firesImmediately: Bool = false,
        missedTicks: MissedTickPolicy = .coalesce,
        queue: DispatchQueue = .global(),
        scheduler: (any TimerScheduler)? = nil,
        handler: @escaping @Sendable () -> Void
    ) {
        self.init(
            interval: interval, leeway: leeway, repetitions: repetitions, firesImmediately: firesImmediately,
            missedTicks: missedTicks, executor: .queue(queue), scheduler: scheduler,
            coreHandler: .plain(handler))
    }

    /// Creates a timer whose handler runs on the main actor.
    ///
    /// ```swift
    /// let clock = RepeatingTimer(interval: .seconds(1)) { @MainActor in
    ///     clockLabel.text = formatter.string(from: .now)
    /// }
    /// clock.start()
    /// ```
    ///
    /// Everything else is as in
    /// ``init(interval:leeway:repetitions:firesImmediately:missedTicks:queue:scheduler:handler:)``.
    /// Under a `ManualTimerScheduler` the handler runs inside `advance(by:)` when
    /// that is called on the main actor, and is enqueued on the main actor
    /// otherwise.
    public convenience init(
        interval: Duration,
        leeway: Duration = .zero,
        repetitions: Int? = nil,
        firesImmediately: Bool = false,
        missedTicks: MissedTickPolicy = .coalesce,
        scheduler: (any TimerScheduler)? = nil,
        handler: @escaping @MainActor @Sendable () -> Void
    ) {
        self.init(
            interval: interval, leeway: leeway, repetitions: repetitions, firesImmediately: firesImmediately,
            missedTicks: missedTicks, executor: .mainActor, scheduler: scheduler,
            coreHandler: .plain(HandlerExecutor.adapt(handler)))
    }

    /// Creates a timer bound to `owner`: it holds `owner` weakly, passes it to the
    /// handler, and cancels itself at its first tick after `owner` is gone (that
    /// tick does not count in ``fireCount`` and yields nothing on ``ticks``).
    ///
    /// ```swift
    /// final class WallScreen: Sendable {
    ///     let interactor = WallInteractor()
    ///     private let poll = Mutex<RepeatingTimer?>(nil)   // import Synchronization
    ///
    ///     func appear() {
    ///         let timer = RepeatingTimer(interval: .seconds(15), owner: interactor) { interactor in
    ///             interactor.fetchWallPosts()
    ///         }
    ///         timer.start()
    ///         poll.withLock { $0 = timer }
    ///     }
    /// }
    /// ```
    ///
    /// Unlike Foundation's `Timer`, which retains its target, this timer never
    /// keeps its owner alive, so the owner's `deinit` runs (and typically releases
    /// the timer, which cancels it). The other parameters are as in
    /// ``init(interval:leeway:repetitions:firesImmediately:missedTicks:queue:scheduler:handler:)``.
    public convenience init<Owner: AnyObject & Sendable>(
        interval: Duration,
        owner: Owner,
        leeway: Duration = .zero,
        repetitions: Int? = nil,
        firesImmediately: Bool = false,
        missedTicks: MissedTickPolicy = .coalesce,
        queue: DispatchQueue = .global(),
        scheduler: (any TimerScheduler)? = nil,
        handler: @escaping @Sendable (Owner) -> Void
    ) {
        self.init(
            interval: interval, leeway: leeway, repetitions: repetitions, firesImmediately: firesImmediately,
            missedTicks: missedTicks, executor: .queue(queue), scheduler: scheduler,
            coreHandler: Self.ownedHandler(owner, handler))
    }

    /// A handler that holds `owner` weakly and passes it to `handler`.
    static func ownedHandler<Owner: AnyObject & Sendable>(
        _ owner: Owner, _ handler: @escaping @Sendable (Owner) -> Void
    ) -> RepeatingTimerCore.Handler {
        let reference = WeakReference(owner)
        return .owned(load: { reference.object }, run: { handler(unsafeDowncast($0, to: Owner.self)) })
    }

    /// Creates a timer bound to `owner` whose handler runs on the main actor: the
    /// main-actor twin of
    /// ``init(interval:owner:leeway:repetitions:firesImmediately:missedTicks:queue:scheduler:handler:)``.
    ///
    /// ```swift
    /// @MainActor final class FeedViewModel {
    ///     private var poll: RepeatingTimer?
    ///     func reload() { /* fetch the feed */ }
    ///     func appear() {
    ///         poll = RepeatingTimer(interval: .seconds(15), owner: self) { @MainActor model in model.reload() }
    ///         poll?.start()
    ///     }
    /// }
    /// ```
    public convenience init<Owner: AnyObject & Sendable>(
        interval: Duration,
        owner: Owner,
        leeway: Duration = .zero,
        repetitions: Int? = nil,
        firesImmediately: Bool = false,
        missedTicks: MissedTickPolicy = .coalesce,
        scheduler: (any TimerScheduler)? = nil,
        handler: @escaping @MainActor @Sendable (Owner) -> Void
    ) {
        let reference = WeakReference(owner)
        self.init(
            interval: interval, leeway: leeway, repetitions: repetitions, firesImmediately: firesImmediately,
            missedTicks: missedTicks, executor: .mainActor, scheduler: scheduler,
            coreHandler: .owned(
                load: { reference.object },
                run: { object in
                    let owner = unsafeDowncast(object, to: Owner.self)
                    MainActor.assumeIsolated { handler(owner) }
                }))
    }

    init(
        interval: Duration,
        leeway: Duration,
        repetitions: Int?,
        firesImmediately: Bool,
        missedTicks: MissedTickPolicy,
        executor: HandlerExecutor,
        scheduler: (any TimerScheduler)?,
        coreHandler: RepeatingTimerCore.Handler
    ) {
        let minimum = DeadlineArithmetic.nanoseconds(Self.minimumInterval)
        let configuration = RepeatingTimerStateMachine.Configuration(
            interval: max(minimum, DeadlineArithmetic.nanoseconds(interval)),
            repetitions: repetitions.map { max(0, $0) },
            firesImmediately: firesImmediately,
            missedTicks: missedTicks
        )
        core = RepeatingTimerCore(
            configuration: configuration, leeway: leeway, executor: executor, scheduler: scheduler, handler: coreHandler
        )
    }

    deinit {
        core.release()
    }

    /// Starts the timer: ``TimerState/idle``, ``TimerState/cancelled`` or
    /// ``TimerState/finished`` → ``TimerState/running``, resetting ``fireCount``.
    /// No-op while running or suspended.
    public func start() { core.start() }

    /// Starts the timer with an initial delay separate from its interval: the
    /// first tick comes `delay` from now (instead of one interval later, or at
    /// once with `firesImmediately`), then one every interval after it.
    ///
    /// ```swift
    /// let heartbeat = RepeatingTimer(interval: .seconds(30)) { ping() }
    /// heartbeat.start(after: .seconds(1))   // 1 s, 31 s, 61 s, …
    /// ```
    ///
    /// Same transitions as ``start()``; a zero or negative delay ticks as soon as
    /// possible, a delay too long to represent never ticks.
    public func start(after delay: Duration) { core.start(after: delay) }

    /// Pauses the timer: ``TimerState/running`` → ``TimerState/suspended``. Ticks
    /// owed under the missed-tick policy are dropped, and an invocation queued but
    /// not begun will not begin; one already running finishes (suspend does not
    /// wait for it, and no other invocation begins before it has). No-op in any
    /// other state.
    public func suspend() { core.suspend() }

    /// Continues a suspended timer: ``TimerState/suspended`` → ``TimerState/running``,
    /// next tick one interval from now. No-op in any other state.
    public func resume() { core.resume() }

    /// Stops the timer: any state → ``TimerState/cancelled`` (no-op when cancelled).
    ///
    /// Once it returns, the handler never begins again (until ``start()``), and it
    /// is not running on another thread (if it was, `cancel()` waited for it).
    /// Called from inside the handler, it returns at once. Do not call it while
    /// holding a lock or occupying a queue that the running handler waits for.
    /// ``ticks`` streams end. ``start()`` restarts the timer. The handler itself is
    /// kept until the timer is released, so that a restart can run it.
    public func cancel() { core.cancel() }

    /// The current state.
    public var state: TimerState { core.state }

    /// Handler invocations since the last ``start()``.
    public var fireCount: Int { core.fireCount }

    /// The interval in effect (the requested one, raised to ``minimumInterval``).
    public var interval: Duration { core.interval }

    /// The ticks as an `AsyncSequence`: one element per handler invocation, from
    /// the moment you ask for it. It ends when the timer is cancelled or finishes
    /// (at once if it already is). Each access creates a new stream; a slow
    /// consumer sees the newest ``tickBufferSize`` ticks.
    ///
    /// ```swift
    /// let timer = RepeatingTimer(interval: .seconds(1), repetitions: 3) {}
    /// let ticks = timer.ticks
    /// timer.start()
    /// for await tick in ticks { print("tick", tick.number) }   // 1, 2, 3, then ends
    /// ```
    public var ticks: AsyncStream<Tick> { core.makeTickStream() }
}

/// A weak reference that can cross threads.
final class WeakReference<Object: AnyObject & Sendable>: Sendable {
    weak let object: Object?
    init(_ object: Object) { self.object = object }
}
