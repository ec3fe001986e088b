import Dispatch
import Synchronization

/// Runs actions at most once per `interval`, keeping the latest call of each
/// window for the window's end.
///
/// ```swift
/// let throttler = Throttler(interval: .seconds(1))
/// func documentChanged() {
///     throttler.call { save() }   // at most one save a second, and the last edit is saved
/// }
/// ```
///
/// Semantics (leading and trailing edge):
/// - A call when no window is open runs its action as soon as possible (on
///   `queue`) and opens a window of `interval`.
/// - Calls during the window replace each other (a replaced action is released at
///   once); when the window ends, the latest one runs and opens the next window.
///   If no call came in, the window simply closes.
/// - So runs are at least `interval` apart, and the last call of a burst always
///   runs, at most `interval` late.
/// - ``cancel()`` drops the waiting action and closes the window; once it returns,
///   no action of this throttler begins, and none is running on another thread.
///   Releasing the throttler cancels it.
///
/// A zero or negative `interval` means no throttling: every call runs as soon as
/// possible.
///
/// Thread safety: every member may be used from any thread.
public final class Throttler: Sendable {
    private struct State {
        /// The end of the open window, in scheduler ticks; nil when none is open.
        var windowEnd: Int64?
        /// The latest call made during the window.
        var waiting: (@Sendable () -> Void)?
        /// Scheduled runs that may not have begun yet (more than one only when
        /// windows are shorter than the time a run takes to start), and the
        /// scheduled end of the window.
        var runs: [DelayedWork] = []
        var windowClose: DelayedWork?
    }

    private let interval: Duration
    private let queue: DispatchQueue
    private let scheduler: any TimerScheduler
    private let state = StateLock(State())

    /// Creates a throttler.
    ///
    /// - Parameters:
    ///   - interval: The least time between two runs.
    ///   - queue: Where actions run (under a manual scheduler: inside `advance(by:)`).
    ///   - scheduler: The scheduler that keeps the windows.
    public init(
        interval: Duration,
        queue: DispatchQueue = .global(),
        scheduler: any TimerScheduler = SystemTimerScheduler.shared
    ) {
        self.interval = interval
        self.queue = queue
        self.scheduler = scheduler
    }

    deinit {
        cancel()
    }

    /// Runs `action` now if no window is open, otherwise keeps it (replacing any
    /// kept one) for the end of the window.
    public func call(_ action: @escaping @Sendable () -> Void) {
        let now = scheduler.engine.nowTicks
        let replaced = state.withLock { state -> (@Sendable () -> Void)? in
            if let end = state.windowEnd, now < end {
                defer { state.waiting = action }
                return state.waiting
            }
            openWindow(&state, now: now, running: action)
            return nil
        }
        withExtendedLifetime(replaced) {}  // released outside the lock
    }

    /// Drops the waiting action and closes the window. Once it returns, no action
    /// of this throttler begins, and none is running on another thread.
    public func cancel() {
        let (runs, windowClose, waiting) = state.withLock {
            state -> ([DelayedWork], DelayedWork?, (@Sendable () -> Void)?) in
            defer { state = State() }
            return (state.runs, state.windowClose, state.waiting)
        }
        for run in runs { run.cancel() }
        windowClose?.cancel()
        withExtendedLifetime(waiting) {}
    }

    /// Runs `action` as soon as possible and schedules the end of a new window
    /// (lock held).
    private func openWindow(_ state: inout State, now: Int64, running action: @escaping @Sendable () -> Void) {
        state.windowEnd = DeadlineArithmetic.deadline(now: now, after: interval)
        state.runs.removeAll { $0.state == .completed }
        state.runs.append(DelayedWork.schedule(after: .zero, on: queue, scheduler: scheduler, action))
        state.windowClose = DelayedWork.schedule(after: interval, on: queue, scheduler: scheduler) { [weak self] in
            self?.windowEnded()
        }
    }

    /// The window is over: run the action kept for it, opening the next window, or
    /// close.
    private func windowEnded() {
        let now = scheduler.engine.nowTicks
        state.withLock { state in
            guard let waiting = state.waiting else {
                state.windowEnd = nil
                state.windowClose = nil
                return
            }
            state.waiting = nil
            openWindow(&state, now: now, running: waiting)
        }
    }
}
