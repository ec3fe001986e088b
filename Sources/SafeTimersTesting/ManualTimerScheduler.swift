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
/// let fired = Mutex(0)   // import Synchronization: handlers are @Sendable
/// let timer = RepeatingTimer(interval: .seconds(30), scheduler: manual) { fired.withLock { $0 += 1 } }
/// timer.start()
/// manual.advance(by: .seconds(3600))
/// #expect(fired.withLock { $0 } == 120)
/// ```
///
/// Under a manual scheduler, handlers run synchronously inside `advance(by:)`, on
/// the calling thread, whatever `queue:` a primitive was given, and nowhere else:
/// no waiting, no yielding, no real sleep. Entries fire in deadline order, ties
/// in the order they were armed, and entries armed by a handler during an advance
/// fire within the same advance when they fall due before its end (one armed for
/// an instant already reached runs at the next instant: see ``advance(by:)``).
///
/// A `@MainActor` handler runs inside the advance only when the advance runs on
/// the main actor (a `@MainActor` test); otherwise it is enqueued on the main
/// actor, and what it leaves owed runs in the next advance.
///
/// Async code sleeps on `clock`; ``waitForSleepers(_:)`` tells a
/// test when the code under test has reached its sleep.
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
    /// An entry armed during the advance for an instant the clock has already
    /// reached (a zero or negative delay) runs at the next instant the advance
    /// moves to, or in the next advance, so work that keeps scheduling itself
    /// with a zero delay cannot make an advance loop forever. It runs there in
    /// deadline order, ties in arming order, like everything else, and until
    /// then it is pending like any armed work (`pendingCount` counts it; a
    /// cancel removes it). Likewise, if
    /// handlers keep triggering each other at one instant (say a zero-interval
    /// `Throttler` whose action calls it again), the advance stops at that
    /// instant after 100,000 deliveries and leaves the rest for the next one.
    ///
    /// A task woken by the advance (a sleep on ``clock``) runs concurrently with
    /// the rest of the advance: to test a loop that sleeps again, advance one
    /// sleep at a time (`waitForSleepers`, then `advance` to its deadline).
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
    /// in the past leaves the clock where it is and runs what is due now.
    public func advance(to instant: Duration) {
        engine.advance(to: instant)
    }

    /// Runs what is due now, then advances to the earliest pending deadline and
    /// runs what falls due there, repeating until nothing is pending or `limit`
    /// rounds have run.
    ///
    /// Returns the number of rounds run. Entries that never fire (armed with a
    /// delay too long to represent) are left pending. A timer that re-arms itself
    /// forever (a `RepeatingTimer`, or work that schedules itself again) keeps it
    /// busy until `limit`: each round runs it at most once per instant, and at
    /// most 100,000 handler deliveries (see ``advance(by:)``), so this always
    /// returns.
    @discardableResult
    public func runUntilIdle(limit: Int = 10_000) -> Int {
        var rounds = 0
        while rounds < limit {
            if engine.queuedDeliveryCount > 0 {
                engine.advance(by: .zero)
            } else if let next = engine.nextDeadline, next != Int64.max {
                engine.advance(toTicks: next)
            } else {
                break
            }
            rounds += 1
        }
        return rounds
    }

    /// The scheduler's clock as an instant (see `TimerClock`).
    public var instant: TimerClock.Instant { clock.now }

    /// Moves the clock forward to `instant` (an instant of this scheduler's
    /// `clock`) and runs every handler that falls due, as
    /// ``advance(by:)`` does. An instant in the past leaves the clock where it is
    /// and runs what is due now.
    public func advance(to instant: TimerClock.Instant) {
        engine.advance(to: instant.sinceCreation)
    }

    /// Returns once at least `count` tasks are suspended in a sleep on this
    /// scheduler's `clock` (`clock.sleep`, `Task.sleep(…, clock:)`,
    /// or anything built on them, such as swift-async-algorithms' `debounce`).
    ///
    /// This is how an async test knows that the code under test has reached its
    /// sleep before it calls ``advance(by:)``, without yielding and hoping:
    ///
    /// ```swift
    /// let manual = ManualTimerScheduler()
    /// let task = Task { try await manual.clock.sleep(for: .seconds(5)); return "woke" }
    /// await manual.waitForSleepers(1)
    /// manual.advance(by: .seconds(5))
    /// #expect(try await task.value == "woke")
    /// ```
    ///
    /// A sleep counts from the moment its entry is armed until its deadline passes
    /// or its task is cancelled. Waits until the count is reached, or until the
    /// calling task is cancelled: then it returns at once (whatever the count)
    /// and leaves nothing registered.
    public func waitForSleepers(_ count: Int) async {
        await engine.waitForSleepers(count)
    }

    /// How many tasks are suspended in a sleep on this scheduler's clock.
    public var sleeperCount: Int { engine.sleeperCount }
}
