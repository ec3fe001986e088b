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
    ///   - queue: Where `onTimeout` runs.
    ///   - scheduler: The scheduler that keeps the deadline.
    ///   - onTimeout: Called once if the deadline passes before ``invalidate()``;
    ///     released once the watchdog fired or was invalidated.
    public init(
        timeout: Duration,
        queue: DispatchQueue = .global(),
        scheduler: any TimerScheduler = SystemTimerScheduler.shared,
        onTimeout: @escaping @Sendable () -> Void
    ) {
        core = WatchdogCore(timeout: timeout, executor: .queue(queue), scheduler: scheduler, handler: onTimeout)
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
        scheduler: any TimerScheduler = SystemTimerScheduler.shared,
        onTimeout: @escaping @MainActor @Sendable () -> Void
    ) {
        core = WatchdogCore(
            timeout: timeout, executor: .mainActor, scheduler: scheduler, handler: HandlerExecutor.adapt(onTimeout))
    }

    deinit {
        core.invalidate()
    }

    /// Re-arms the watchdog: the deadline becomes now + timeout.
    ///
    /// No effect once the watchdog has fired or was invalidated.
    ///
    /// - Complexity: O(1): a clock read and a lock; the engine is not touched.
    public func kick() { core.kick() }

    /// Disarms the watchdog for good and releases the handler.
    ///
    /// Idempotent. Once it returns, the handler never begins; if the handler was
    /// already running on another thread, `invalidate()` waits for it to return
    /// (called from inside the handler, it returns at once).
    public func invalidate() { core.invalidate() }

    /// Whether the deadline passed and the handler began.
    public var hasFired: Bool { core.hasFired }

    /// The timeout the watchdog was created with.
    public var timeout: Duration { core.timeout }
}

/// The engine entry behind a ``Watchdog``: the public object can be released (which
/// invalidates) while the engine still holds this.
final class WatchdogCore: TimerEntry {
    private enum Status { case armed, fired, invalidated }

    private struct Storage: InvocationBarrierHolder {
        var status = Status.armed
        /// The deadline the watchdog wants; `kick()` moves it later.
        var deadline: Int64 = 0
        /// The deadline the engine entry is armed at; at most `deadline`.
        var armedSequence: UInt64 = 0
        var handler: (@Sendable () -> Void)?
        var barrier = InvocationBarrier()
    }

    let timeout: Duration
    private let timeoutTicks: Int64
    private let storage: StateLock<Storage>
    private let index = Atomic<Int>(-1)
    private let executor: HandlerExecutor
    /// The scheduler's engine (the scheduler itself is not needed once armed).
    private let engine: TimerEngine

    init(
        timeout: Duration, executor: HandlerExecutor, scheduler: any TimerScheduler,
        handler: @escaping @Sendable () -> Void
    ) {
        self.timeout = timeout
        self.timeoutTicks = DeadlineArithmetic.delayNanoseconds(timeout)
        self.executor = executor
        self.engine = scheduler.engine
        self.storage = StateLock(Storage(handler: handler))
        storage.withLock { storage in
            storage.deadline = DeadlineArithmetic.adding(timeoutTicks, to: engine.nowTicks)
            storage.armedSequence = engine.arm(self, at: storage.deadline)
        }
    }

    var timerSlot: Int {
        get { index.load(ordering: .relaxed) }
        set { index.store(newValue, ordering: .relaxed) }
    }

    var hasFired: Bool { storage.withLock { $0.status == .fired } }

    func kick() {
        let deadline = DeadlineArithmetic.adding(timeoutTicks, to: engine.nowTicks)
        storage.withLock { storage in
            guard storage.status == .armed else { return }
            storage.deadline = max(storage.deadline, deadline)
        }
    }

    func invalidate() {
        _ = storage.cancelOnce { storage in
            switch storage.status {
            case .armed:
                storage.status = .invalidated
                engine.disarm(self)
                defer { storage.handler = nil }
                return (true, storage.handler, false)
            case .fired:
                return (false, nil, true)
            case .invalidated:
                return (false, nil, false)
            }
        }
    }

    func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        let due = storage.withLock { storage -> Bool in
            guard storage.status == .armed, storage.armedSequence == sequence else { return false }
            if storage.deadline > deadline {
                // Kicked since it was armed: move the entry to the new deadline.
                storage.armedSequence = engine.arm(self, at: storage.deadline)
                return false
            }
            return true
        }
        guard due else { return }
        executor.deliver(engine: engine) { self.run() }
    }

    private func run() {
        storage.runOnce(claim: { storage in
            guard storage.status == .armed else { return nil }
            storage.status = .fired
            defer { storage.handler = nil }
            return storage.handler
        })
    }
}
