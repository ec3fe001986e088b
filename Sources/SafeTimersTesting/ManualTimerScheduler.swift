@_spi(SchedulerImplementation) import SafeTimers

/// A scheduler whose clock moves only when you call ``advance(by:)``.
///
/// Use it to test time-dependent code deterministically and fast: an hour of a
/// 30-second timer is 120 handler calls that take microseconds.
///
/// ```swift
/// import SafeTimers
/// import SafeTimersTesting
///
/// let manual = ManualTimerScheduler()
/// var fired = 0
/// let timer = RepeatingTimer(interval: .seconds(30), scheduler: manual) { fired += 1 }
/// timer.start()
/// manual.advance(by: .seconds(3600))
/// #expect(fired == 120)
/// ```
///
/// Under a manual scheduler, handlers run synchronously inside `advance(by:)`, on
/// the calling thread, whatever `queue:` a primitive was given: no waiting, no
/// yielding, no real sleep. Entries fire in deadline order, ties in the order they
/// were armed, and entries armed by a handler during an advance fire within the
/// same advance when they fall due before its end.
///
/// Thread safety: other threads may arm and cancel entries while one thread
/// advances; handlers run on the advancing thread.
public final class ManualTimerScheduler: TimerScheduler {
    /// The engine that keeps this scheduler's entries (SPI).
    @_spi(SchedulerImplementation)
    public let engine = TimerEngine(virtual: true)

    /// Creates a scheduler whose clock reads `.zero`.
    public init() {}

    /// Releasing a manual scheduler releases everything armed on it: its time can
    /// never move again, so nothing armed on it could ever run. Primitives that
    /// still exist stay in their current state (a `DelayedWork` stays
    /// `.pending`) and ignore further arming.
    deinit {
        engine.shutDown()
    }

    /// Moves the clock forward by `duration` and runs every handler that falls due.
    ///
    /// A zero or negative `duration` runs only what is due already and leaves the
    /// clock where it is; a duration too long to represent moves the clock to the
    /// end of time, firing everything except entries that never fire.
    ///
    /// - Complexity: O(k) for k firings, whatever the number of pending entries
    ///   (plus at most 8 moves per entry between the wheel's levels over its life).
    public func advance(by duration: Duration) {
        engine.advance(by: duration)
    }

    /// Moves the clock forward to `instant` (a time since the scheduler was
    /// created, like ``now``) and runs every handler that falls due. An instant
    /// in the past leaves the clock where it is.
    public func advance(to instant: Duration) {
        engine.advance(to: instant)
    }

    /// Advances to the earliest pending deadline and runs what falls due there,
    /// repeating until nothing is pending or `limit` rounds have run.
    ///
    /// Returns the number of rounds run. Entries that never fire (armed with a
    /// delay too long to represent) are left pending.
    @discardableResult
    public func runUntilIdle(limit: Int = 10_000) -> Int {
        var rounds = 0
        while rounds < limit, let next = engine.nextDeadline, next != Int64.max {
            engine.advance(toTicks: next)
            rounds += 1
        }
        return rounds
    }
}
