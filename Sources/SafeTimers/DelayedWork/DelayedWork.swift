import Dispatch
import Synchronization

/// A closure scheduled to run once after a delay, with a cancel that means it.
///
/// ```swift
/// let work = DelayedWork.schedule(after: .seconds(2), on: .main) { refresh() }
/// // …
/// if work.cancel() {
///     // refresh() will never run, and everything it captured is already released.
/// }
/// ```
///
/// Compared with `DispatchQueue.asyncAfter` and `DispatchWorkItem.cancel()`:
/// - ``cancel()`` releases the closure and its captures before it returns; a
///   cancelled `DispatchWorkItem` keeps them until its deadline.
/// - ``cancel()`` tells you whether it prevented the run.
/// - ``cancel()`` is a barrier: once it returns, the closure has either finished
///   or will never begin. If the closure is running on another thread, `cancel()`
///   waits for it to return; called from inside the closure, it returns at once.
/// - The closure is released right after it has run, too.
///
/// Dropping the handle does not cancel the work (as with `asyncAfter`): keep the
/// handle if you may need to cancel.
///
/// The delay is measured on the scheduler's monotonic clock; a zero or negative
/// delay runs the work as soon as possible; a delay too long to represent
/// (`.seconds(Int64.max)`) means the work stays pending until cancelled.
///
/// Thread safety: every member may be used from any thread.
public final class DelayedWork: TimerEntry, @unchecked Sendable {
    // `@unchecked Sendable` invariant (the base class `TimerEntry` makes the
    // compiler leave it to us): every stored property is a `let` of a `Sendable`
    // type (the lock that guards the machine, the executor, the engine reference).

    /// Where a delayed work item is in its life.
    public enum State: Sendable, Hashable {
        /// Waiting for its deadline, or due and about to run.
        case pending
        /// The closure is running.
        case running
        /// The closure has run and returned.
        case completed
        /// Cancelled before it began.
        case cancelled
    }

    let storage: StateLock<LockedMachine<DelayedWorkStateMachine>>
    let executor: HandlerExecutor
    private let engineReference: EngineReference
    /// The engine (a counted reference for the caller; the hot paths use
    /// ``withEngine(_:)``, which counts none).
    var engine: TimerEngine { engineReference.counted }

    /// Made pending without its work: ``scheduled(executor:engine:work:at:)``
    /// gives it the work.
    private init(executor: consuming HandlerExecutor, engine: consuming EngineReference) {
        self.executor = executor
        self.engineReference = engine
        self.storage = StateLock(LockedMachine(machine: DelayedWorkStateMachine()))
    }

    /// A work item pending with `work`, due at `deadline` (ticks): the work is
    /// an input like any other, through ``GatedPrimitive/transition(_:)``, whose
    /// only effect (the arming) is applied under the lock. (A machine built with
    /// the closure in it would be copied into the lock and count a reference to
    /// the closure twice; given in `init`, after `super.init()`, the work would
    /// cost a retain and a release of `self`.)
    @inline(__always)
    static func scheduled(
        executor: consuming HandlerExecutor, engine: consuming EngineReference, work: @escaping @Sendable () -> Void,
        at deadline: Int64
    ) -> DelayedWork {
        let item = DelayedWork(executor: executor, engine: engine)
        _ = item.transition { $0.schedule(work, at: deadline) }
        return item
    }

    /// Schedules `work` to run once on `queue` after `delay`.
    ///
    /// - Parameters:
    ///   - delay: How long to wait. Zero or negative: as soon as possible.
    ///     Too long to represent: never (until cancelled).
    ///   - queue: Where the closure runs; `nil` (the default) is the default-QoS
    ///     global queue. Under a `ManualTimerScheduler` it runs inside
    ///     `advance(by:)` instead. The work keeps the queue alive at least until
    ///     the closure has run or been cancelled.
    ///   - scheduler: The scheduler that keeps the deadline; `nil` (the default)
    ///     is ``SystemTimerScheduler/shared``, as for every primitive.
    ///   - work: The closure. It is released right after it runs or is cancelled.
    /// - Returns: A handle to cancel the work or query its state.
    /// - Complexity: O(1) in the number of pending timers (a timing-wheel bucket).
    public static func schedule(
        after delay: Duration,
        on queue: DispatchQueue? = nil,
        scheduler: (any TimerScheduler)? = nil,
        _ work: @escaping @Sendable () -> Void
    ) -> DelayedWork {
        schedule(after: delay, executor: .on(queue), engine: EngineReference(scheduler), work)
    }

    /// Schedules `work` to run once on the main actor after `delay`.
    ///
    /// ```swift
    /// let hide = DelayedWork.schedule(after: .seconds(3)) { @MainActor in
    ///     banner.isHidden = true
    /// }
    /// ```
    ///
    /// Everything else is as in ``schedule(after:on:scheduler:_:)``. Under a
    /// `ManualTimerScheduler`, the work runs inside `advance(by:)` when that is
    /// called on the main actor, and is enqueued on the main actor otherwise (it
    /// then runs outside the advance).
    public static func schedule(
        after delay: Duration,
        scheduler: (any TimerScheduler)? = nil,
        _ work: @escaping @MainActor @Sendable () -> Void
    ) -> DelayedWork {
        schedule(after: delay, executor: .mainActor, engine: EngineReference(scheduler), HandlerExecutor.adapt(work))
    }

    /// Schedules `work` to run once on `queue` at `deadline`, an instant of
    /// `scheduler`'s ``TimerScheduler/clock``.
    ///
    /// ```swift
    /// let manual = ManualTimerScheduler()
    /// let deadline = manual.clock.now.advanced(by: .seconds(2))
    /// let work = DelayedWork.schedule(at: deadline, scheduler: manual) { refresh() }
    /// ```
    ///
    /// A deadline in the past runs the work as soon as possible; the far end of
    /// time never runs it (until cancelled). Everything else is as in
    /// ``schedule(after:on:scheduler:_:)``.
    public static func schedule(
        at deadline: TimerClock.Instant,
        on queue: DispatchQueue? = nil,
        scheduler: (any TimerScheduler)? = nil,
        _ work: @escaping @Sendable () -> Void
    ) -> DelayedWork {
        DelayedWork.scheduled(executor: .on(queue), engine: EngineReference(scheduler), work: work, at: deadline.ticks)
    }

    /// Schedules `work` to run once on the main actor at `deadline`; see
    /// ``schedule(at:on:scheduler:_:)``.
    public static func schedule(
        at deadline: TimerClock.Instant,
        scheduler: (any TimerScheduler)? = nil,
        _ work: @escaping @MainActor @Sendable () -> Void
    ) -> DelayedWork {
        DelayedWork.scheduled(
            executor: .mainActor, engine: EngineReference(scheduler), work: HandlerExecutor.adapt(work),
            at: deadline.ticks)
    }

    /// Moves a pending work's deadline to `deadline` (an instant of the scheduler's
    /// clock); see ``reschedule(after:)``.
    @discardableResult
    public func reschedule(at deadline: TimerClock.Instant) -> Bool {
        let effects = transition { $0.reschedule(to: deadline.ticks) }
        let rescheduled = effects.movedDeadline
        complete(effects)
        return rescheduled
    }

    /// Schedules `work` to run once for `executor` after `delay` on `engine`'s clock.
    @inline(__always)
    static func schedule(
        after delay: Duration,
        executor: consuming HandlerExecutor,
        engine: consuming EngineReference,
        _ work: @escaping @Sendable () -> Void
    ) -> DelayedWork {
        let deadline = engine.with { DeadlineArithmetic.deadline(now: $0.nowTicks, after: delay) }
        return DelayedWork.scheduled(executor: executor, engine: engine, work: work, at: deadline)
    }

    /// Schedules `work` for `executor` at `deadline` (engine ticks): the
    /// interleaving explorer's and the engine tests' way in.
    static func schedule(
        atTicks deadline: Int64, executor: HandlerExecutor, engine: TimerEngine,
        _ work: @escaping @Sendable () -> Void
    ) -> DelayedWork {
        DelayedWork.scheduled(executor: executor, engine: EngineReference(engine), work: work, at: deadline)
    }

    /// The current state.
    public var state: State { storage.withLock { $0.machine.state } }

    /// Cancels the work if it has not begun.
    ///
    /// Returns `true` only if this call prevented the run. By the time it returns,
    /// the closure and everything it captured have been released (unless the
    /// closure is the caller), and the closure is not running on another thread:
    /// if it was, `cancel()` waited for it to return. Idempotent: later calls
    /// return `false`.
    ///
    /// Do not call `cancel()` while holding a lock or occupying a queue that the
    /// running closure waits for: it would wait for the closure, and the closure
    /// for you.
    ///
    /// - Complexity: O(1) in the number of pending timers.
    @discardableResult
    public func cancel() -> Bool {
        cancel(waitingForRun: true)
    }

    /// What ``cancelWithoutWaiting()`` found, and did.
    public enum CancelOutcome: Sendable, Hashable {
        /// This call stopped the run: the closure never begins, and it and its
        /// captures were released before the call returned.
        case prevented
        /// The closure is running now (on another thread, or the caller is the
        /// closure): it goes on, and the call did not wait for it. Its captures
        /// are released when it returns.
        case running
        /// The closure had already run and returned.
        case completed
        /// An earlier cancel had stopped the run.
        case alreadyCancelled
    }

    /// Cancels the work if it has not begun, and never waits: for code on an
    /// event-loop thread (a SwiftNIO loop, a Hummingbird handler), where
    /// ``cancel()``'s wait for a closure running on another thread would block
    /// the loop.
    ///
    /// **Not a barrier.** When it returns ``CancelOutcome/running``, the closure
    /// may still be running on another thread. Otherwise it gives the same
    /// guarantees as ``cancel()``: after ``CancelOutcome/prevented`` the closure
    /// never begins and it and its captures are already released.
    ///
    /// ```swift
    /// let expiry = DelayedWork.schedule(after: .seconds(5)) { channel.close(promise: nil) }
    /// defer { _ = expiry.cancelWithoutWaiting() }   // on the event loop: never blocks it
    /// ```
    ///
    /// - Complexity: O(1) in the number of pending timers.
    @discardableResult
    public func cancelWithoutWaiting() -> CancelOutcome {
        var outcome = CancelOutcome.alreadyCancelled
        let effects = transition { machine in
            outcome = machine.cancelOutcome
            return machine.cancel(thread: ThreadIdentity.current(), waiting: false)
        }
        complete(effects)
        return outcome
    }

    /// Cancels like ``cancel()``; without waiting for a closure that is already
    /// running on another thread when `waitingForRun` is false.
    @discardableResult
    func cancel(waitingForRun: Bool) -> Bool {
        let effects = transition { $0.cancel(thread: ThreadIdentity.current(), waiting: waitingForRun) }
        let prevented = effects.preventedRun
        complete(effects)
        return prevented
    }

    /// Moves a pending work's deadline to `delay` from now (Go's `Timer.Reset`).
    ///
    /// Returns `true` if the work was still pending (it now runs `delay` from
    /// now, even if its old deadline had just passed and the run was about to
    /// begin); `false` if it had begun, completed or been cancelled, in which case
    /// nothing changes. Delays are treated as in ``schedule(after:on:scheduler:_:)``.
    ///
    /// - Complexity: O(1) in the number of pending timers.
    @discardableResult
    public func reschedule(after delay: Duration) -> Bool {
        let deadline = DeadlineArithmetic.deadline(now: engine.nowTicks, after: delay)
        let effects = transition { $0.reschedule(to: deadline) }
        let rescheduled = effects.movedDeadline
        complete(effects)
        return rescheduled
    }

    /// Whether the work closure is still held (tests).
    var holdsWork: Bool { storage.withLock { $0.machine.holdsWork } }

    /// The first half of an invocation (tests drive it directly): the work, if
    /// `tag` may begin on `thread`.
    func begin(tag: UInt64, thread: UInt) -> (@Sendable () -> Void)? {
        storage.withLock { $0.machine.begin(tag: tag, thread: thread) }
    }

    /// The second half of an invocation.
    func end() {
        complete(transition { $0.end() })
    }

    /// The engine fired the arming `sequence` (see ``TimerEntry``).
    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        fired(sequence: sequence) { $0.deadlinePassed() }
    }
}

extension DelayedWork: ClosureInvoking {
    /// The engine, borrowed (see ``EngineReference``).
    @inline(__always)
    func withEngine<Result>(_ body: (TimerEngine) -> Result) -> Result {
        engineReference.with(body)
    }
}
