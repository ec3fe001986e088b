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
/// Semantics (trailing edge only):
/// - Each ``call(_:)`` replaces the pending action (the replaced one is released at
///   once) and moves the deadline to *now + delay*.
/// - When the deadline passes, the latest action runs once on `queue`.
/// - A call made while an action is running schedules a new run after `delay`; it
///   never waits for the running one.
/// - ``cancel()`` drops the pending action; once it returns, no action of this
///   debouncer begins, and none is running on another thread.
/// - Releasing the debouncer cancels it.
///
/// A zero or negative `delay` runs each action as soon as possible (calls still
/// replace an action that has not started yet).
///
/// Thread safety: every member may be used from any thread.
public final class Debouncer: Sendable {
    private let delay: Duration
    private let queue: DispatchQueue
    private let scheduler: any TimerScheduler
    private let pending = StateLock<DelayedWork?>(nil)

    /// Creates a debouncer.
    ///
    /// - Parameters:
    ///   - delay: How long calls must stop before the last one runs.
    ///   - queue: Where actions run (under a manual scheduler: inside `advance(by:)`).
    ///   - scheduler: The scheduler that keeps the deadline.
    public init(
        delay: Duration,
        queue: DispatchQueue = .global(),
        scheduler: any TimerScheduler = SystemTimerScheduler.shared
    ) {
        self.delay = delay
        self.queue = queue
        self.scheduler = scheduler
    }

    deinit {
        cancel()
    }

    /// Replaces the pending action with `action`, to run `delay` after this call
    /// unless another call comes first.
    ///
    /// - Complexity: O(1) in the number of pending timers.
    public func call(_ action: @escaping @Sendable () -> Void) {
        let replaced = pending.withLock { pending -> DelayedWork? in
            let previous = pending
            pending = DelayedWork.schedule(after: delay, on: queue, scheduler: scheduler, action)
            return previous
        }
        replaced?.cancel(waitingForRun: false)
    }

    /// Drops the pending action, if any. Once it returns, no action of this
    /// debouncer begins, and none is running on another thread.
    public func cancel() {
        pending.withLock { pending in
            defer { pending = nil }
            return pending
        }?.cancel()
    }
}
