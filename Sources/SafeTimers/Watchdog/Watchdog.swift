import Dispatch
import Synchronization

/// A one-shot deadline for a critical section: arm it before, invalidate it after,
/// and it calls your handler only if the section overran.
///
/// ```swift
/// let dog = Watchdog(timeout: .seconds(2)) { log.warning("sync took longer than 2 s") }
/// try syncEverything()     // call dog.kick() on progress to push the deadline back
/// dog.invalidate()
/// ```
///
/// - The watchdog is armed as soon as it is created.
/// - ``kick()`` moves the deadline to *now + timeout*. It costs a clock read and a
///   lock, not a re-arm: the engine entry is moved lazily when the old deadline
///   passes.
/// - ``invalidate()`` is idempotent and a barrier: once it returns, the handler
///   never begins, and if it was running on another thread it has returned.
/// - Releasing the watchdog invalidates it.
///
/// The handler runs on `queue` (under a manual scheduler, inside `advance(by:)`),
/// while the guarded section may still be running; it runs at most once. A zero or
/// negative timeout fires as soon as possible; a timeout too long to represent
/// never fires. For the scoped forms see ``withWatchdog(timeout:queue:scheduler:onTimeout:_:)``.
///
/// Thread safety: every member may be used from any thread.
public final class Watchdog: Sendable {
    private let core: WatchdogCore

    /// Creates and arms a watchdog.
    ///
    /// - Parameters:
    ///   - timeout: How long the guarded section may take.
    ///   - queue: Where `onTimeout` runs; `nil` (the default) is a serial queue
    ///     of its own (default QoS), made for that report. Not the global queue:
    ///     on Linux it adds a thread about once a second while its threads are
    ///     blocked, so a report sent there would wait behind the blocked work
    ///     it may be about (measured: 7 s behind 8 blocked blocks, 14 s behind 16).
    ///     A queue of its own gets a thread at once, so each report that is
    ///     running holds a thread of its own: reports that block (on one lock,
    ///     say) add a thread each, up to libdispatch's limit. Give a `queue` to
    ///     bound them.
    ///   - scheduler: The scheduler that keeps the deadline; `nil` (the default) is
    ///     ``SystemTimerScheduler/shared``.
    ///   - onTimeout: Called once if the deadline passes before ``invalidate()``;
    ///     released once the watchdog fired or was invalidated.
    public init(
        timeout: Duration,
        queue: DispatchQueue? = nil,
        scheduler: (any TimerScheduler)? = nil,
        onTimeout: @escaping @Sendable () -> Void
    ) {
        core = WatchdogCore.armed(
            timeout: timeout, executor: .forReports(on: queue), engine: EngineReference(scheduler), handler: onTimeout)
    }

    /// Creates and arms a watchdog whose handler runs on a Swift executor: a
    /// SwiftNIO event loop's, say, so that a request's timeout runs on the
    /// request's own loop.
    ///
    /// ```swift
    /// let dog = Watchdog(timeout: .seconds(5), executor: channel.eventLoop.executor) {
    ///     channel.close(promise: nil)
    /// }
    /// ```
    ///
    /// `executor` is where `onTimeout` runs: a Swift executor, such as a SwiftNIO event loop's `executor`, an
    /// actor's custom executor, or a `TaskExecutor`. Each delivery starts a task whose one job is enqueued
    /// directly on `executor` (no dispatch queue in between); handlers due together for the same executor
    /// object share a task per 16, enqueued in deadline order (so they run in that order on an executor that
    /// runs its jobs in the order they come, as event loops and actors do). Under a `ManualTimerScheduler`
    /// `onTimeout` runs inside `advance(by:)` instead. The primitive keeps `executor` alive for as long as it
    /// exists, as it keeps a queue.
    ///
    /// Everything else is as in ``init(timeout:queue:scheduler:onTimeout:)``.
    public init(
        timeout: Duration,
        executor: any Executor,
        scheduler: (any TimerScheduler)? = nil,
        onTimeout: @escaping @Sendable () -> Void
    ) {
        core = WatchdogCore.armed(
            timeout: timeout, executor: .onExecutor(executor), engine: EngineReference(scheduler),
            handler: onTimeout)
    }

    /// Creates and arms a watchdog whose handler runs on the main actor.
    ///
    /// ```swift
    /// let dog = Watchdog(timeout: .seconds(5)) { @MainActor in
    ///     spinner.showSlowNetworkHint()
    /// }
    /// ```
    ///
    /// Everything else is as in ``init(timeout:queue:scheduler:onTimeout:)``.
    public init(
        timeout: Duration,
        scheduler: (any TimerScheduler)? = nil,
        onTimeout: @escaping @MainActor @Sendable () -> Void
    ) {
        core = WatchdogCore.armed(
            timeout: timeout, executor: .mainActor, engine: EngineReference(scheduler),
            handler: HandlerExecutor.adapt(onTimeout))
    }

    deinit {
        core.invalidateUnlessInvalidated()
    }

    /// Re-arms the watchdog: the deadline becomes now + timeout.
    ///
    /// Returns `true` if it did. A kick has no effect (and returns `false`) once
    /// the deadline is reached, by the scheduler's clock, even if a busy
    /// scheduler thread has not fired the watchdog yet: the handler has then
    /// begun, or is about to begin on its queue, and still runs. It has no
    /// effect after ``invalidate()`` either.
    ///
    /// A kicked watchdog keeps its engine entry at the old deadline and moves it
    /// then (so a kick costs a clock read and a lock): among entries due at the
    /// same instant, it is ordered by that move, not by the kick.
    ///
    /// - Complexity: O(1): a clock read and a lock; the engine is not touched.
    @discardableResult
    public func kick() -> Bool { core.kick() }

    /// Re-arms the watchdog with a new timeout: the deadline becomes now +
    /// `timeout`, and later ``kick()`` calls use it too. A shorter timeout than
    /// before moves the engine entry at once.
    ///
    /// Returns `true` if it did; like ``kick()``, it has no effect once the
    /// deadline has passed or the watchdog was invalidated. Timeouts are treated
    /// as in ``init(timeout:queue:scheduler:onTimeout:)``.
    ///
    /// - Complexity: O(1) in the number of pending timers.
    @discardableResult
    public func kick(timeout: Duration) -> Bool { core.kick(timeout: timeout) }

    /// Disarms the watchdog for good and releases the handler.
    ///
    /// Idempotent. Once it returns, the handler never begins; if the handler was
    /// already running on another thread, `invalidate()` waits for it to return
    /// (called from inside the handler, it returns at once).
    public func invalidate() { core.invalidate() }

    /// Whether the deadline passed and the handler began.
    public var hasFired: Bool { core.hasFired }

    /// The timeout in effect: the one the watchdog was created with, or the one
    /// the last ``kick(timeout:)`` set.
    public var timeout: Duration { core.timeout }
}

/// The storage behind a ``Watchdog``: the public object can be released (which
/// invalidates) while the engine still holds this.
/// `@unchecked Sendable` invariant (the base class ``TimerEntry`` makes the
/// compiler leave it to us): every stored property is a `let` of a `Sendable`
/// type (the lock that guards the machine, atomics, the executor, the engine).
final class WatchdogCore: TimerEntry, ClosureInvoking, @unchecked Sendable {
    let storage: StateLock<LockedMachine<WatchdogStateMachine>>
    /// Whether an ``invalidate()`` found the watchdog settled (see
    /// ``WatchdogStateMachine/isSettled``).
    private let invalidated = Atomic<Bool>(false)
    let executor: HandlerExecutor
    /// The scheduler's engine: kept, so releasing the scheduler never drops the watchdog.
    private let engineReference: EngineReference

    var engine: TimerEngine { engineReference.counted }

    private init(timeout: Duration, executor: HandlerExecutor, engine: consuming EngineReference) {
        self.executor = executor
        self.engineReference = engine
        self.storage = StateLock(LockedMachine(machine: WatchdogStateMachine(timeout: timeout)))
    }

    /// A watchdog core armed with `handler`, due `timeout` from now. (Armed here
    /// rather than in `init`: a subclass's `self` after `super.init()` costs a
    /// retain and a release at every use.)
    @inline(__always)
    static func armed(
        timeout: Duration, executor: HandlerExecutor, engine: consuming EngineReference,
        handler: @escaping @Sendable () -> Void
    ) -> WatchdogCore {
        let core = WatchdogCore(timeout: timeout, executor: executor, engine: engine)
        let now = core.engineReference.with { $0.nowTicks }
        core.complete(core.transition { $0.arm(now: now, handler: handler) })
        return core
    }

    /// The engine, borrowed (see ``EngineReference``).
    @inline(__always)
    func withEngine<Result>(_ body: (TimerEngine) -> Result) -> Result {
        engineReference.with(body)
    }

    /// Not inlined: inlined into the deallocating deinit, destroying the fields
    /// retained and released `self` around them (two atomic writes per watchdog).
    @inline(never) deinit {}

    var hasFired: Bool { storage.withLock { $0.machine.status == .fired } }

    var timeout: Duration { storage.withLock { $0.machine.timeoutDuration } }

    /// Whether the handler is still held (tests).
    var holdsHandler: Bool { storage.withLock { $0.machine.holdsHandler } }

    func kick(timeout newTimeout: Duration? = nil) -> Bool {
        let now = withEngine { $0.nowTicks }
        let effects = transition { $0.kick(now: now, timeout: newTimeout) }
        let kicked = effects.movedDeadline
        complete(effects)
        return kicked
    }

    func invalidate() {
        var settled = false
        complete(
            transition { machine in
                let effects = machine.invalidate(thread: ThreadIdentity.current())
                settled = machine.isSettled
                return effects
            })
        if settled { invalidated.store(true, ordering: .relaxed) }
    }

    /// ``invalidate()``, skipped when an earlier call left nothing to do or wait
    /// for (not one made from inside the running handler, nor one whose wait
    /// was refused): the handle's `deinit`, which no other call through the
    /// handle can race with.
    func invalidateUnlessInvalidated() {
        if !invalidated.load(ordering: .relaxed) { invalidate() }
    }

    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        fired(sequence: sequence) { $0.deadlinePassed(deadline) }
    }

    /// The first half of an invocation (tests drive it directly).
    func begin(tag: UInt64, thread: UInt) -> (@Sendable () -> Void)? {
        storage.withLock { $0.machine.begin(tag: tag, thread: thread) }
    }

    /// The second half of an invocation.
    func end() {
        complete(transition { $0.end() })
    }
}
