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
public final class DelayedWork: Sendable {
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

    private struct Storage: InvocationBarrierHolder {
        var state = State.pending
        var work: (@Sendable () -> Void)?
        var barrier = InvocationBarrier()
    }

    private let storage: StateLock<Storage>
    private let index = Atomic<Int>(-1)
    private let executor: HandlerExecutor
    /// The scheduler's engine (the scheduler itself is not needed once armed).
    private let engine: TimerEngine

    private init(executor: HandlerExecutor, scheduler: any TimerScheduler, work: @escaping @Sendable () -> Void) {
        self.executor = executor
        self.engine = scheduler.engine
        self.storage = StateLock(Storage(work: work))
    }

    /// Schedules `work` to run once on `queue` after `delay`.
    ///
    /// - Parameters:
    ///   - delay: How long to wait. Zero or negative: as soon as possible.
    ///     Too long to represent: never (until cancelled).
    ///   - queue: Where the closure runs. Under a `ManualTimerScheduler` it runs
    ///     inside `advance(by:)` instead.
    ///   - scheduler: The scheduler that keeps the deadline.
    ///   - work: The closure. It is released right after it runs or is cancelled.
    /// - Returns: A handle to cancel the work or query its state.
    /// - Complexity: O(1) in the number of pending timers (a timing-wheel bucket).
    public static func schedule(
        after delay: Duration,
        on queue: DispatchQueue = .global(),
        scheduler: any TimerScheduler = SystemTimerScheduler.shared,
        _ work: @escaping @Sendable () -> Void
    ) -> DelayedWork {
        schedule(after: delay, executor: .queue(queue), scheduler: scheduler, work)
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
    /// called on the main thread, and is enqueued on the main actor otherwise.
    public static func schedule(
        after delay: Duration,
        scheduler: any TimerScheduler = SystemTimerScheduler.shared,
        _ work: @escaping @MainActor @Sendable () -> Void
    ) -> DelayedWork {
        schedule(after: delay, executor: .mainActor, scheduler: scheduler, HandlerExecutor.adapt(work))
    }

    private static func schedule(
        after delay: Duration,
        executor: HandlerExecutor,
        scheduler: any TimerScheduler,
        _ work: @escaping @Sendable () -> Void
    ) -> DelayedWork {
        let item = DelayedWork(executor: executor, scheduler: scheduler, work: work)
        // Armed once and never moved, so a firing needs no sequence check: `run()`
        // decides under the lock whether the work still runs.
        item.engine.arm(item, at: DeadlineArithmetic.deadline(now: item.engine.nowTicks, after: delay))
        return item
    }

    /// The current state.
    public var state: State { storage.withLock { $0.state } }

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

    /// Cancels like ``cancel()``; without waiting for a closure that is already
    /// running on another thread when `waitingForRun` is false.
    @discardableResult
    func cancel(waitingForRun: Bool) -> Bool {
        return storage.cancelOnce(waitingForRun: waitingForRun) { storage in
            switch storage.state {
            case .pending:
                storage.state = .cancelled
                engine.disarm(self)
                defer { storage.work = nil }
                return (true, storage.work, false)
            case .running:
                return (false, nil, true)
            case .completed, .cancelled:
                return (false, nil, false)
            }
        }
    }

    private func run() {
        storage.runOnce(
            claim: { storage in
                guard storage.state == .pending else { return nil }
                storage.state = .running
                defer { storage.work = nil }
                return storage.work
            },
            finish: { $0.state = .completed })
    }
}

extension DelayedWork: TimerEntry {
    var timerSlot: Int {
        get { index.load(ordering: .relaxed) }
        set { index.store(newValue, ordering: .relaxed) }
    }

    func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        // A cancel that raced this firing is seen by `run()`, under the lock.
        executor.deliver(engine: engine) { self.run() }
    }
}
