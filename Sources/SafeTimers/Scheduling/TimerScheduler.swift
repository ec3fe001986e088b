/// Where timers are kept and from which they fire.
///
/// Every SafeTimers primitive takes a `scheduler:` argument. Leave it out to use
/// ``SystemTimerScheduler/shared``, the real-time engine; pass a
/// `ManualTimerScheduler` (from `SafeTimersTesting`) in tests to control time by
/// hand.
///
/// ```swift
/// let work = DelayedWork.schedule(after: .seconds(2)) { refresh() }      // real time
/// let manual = ManualTimerScheduler()
/// let test = DelayedWork.schedule(after: .seconds(2), scheduler: manual) { refresh() }
/// manual.advance(by: .seconds(2))                                         // runs it now
/// ```
///
/// The two schedulers in this package are the only conforming types: the
/// requirement that connects a scheduler to its engine is SPI, so the engine can
/// evolve without breaking users.
///
/// Thread safety: every member may be used from any thread.
public protocol TimerScheduler: AnyObject, Sendable {
    /// The engine that keeps this scheduler's entries.
    @_spi(SchedulerImplementation)
    var engine: TimerEngine { get }
}

extension TimerScheduler {
    /// The time on this scheduler's clock, as the time elapsed since the scheduler
    /// was created.
    ///
    /// For ``SystemTimerScheduler`` the clock is monotonic and does not advance
    /// while the machine sleeps; for a manual scheduler it is virtual.
    public var now: Duration { engine.now }

    /// How many timer entries are armed and waiting for their deadline: what
    /// was armed and not cancelled, and whose deadline the scheduler has not
    /// reached yet (the scheduler's own helper entries are not counted). A work
    /// whose deadline was reached and whose handler still waits for a busy queue
    /// (or the main actor) is no longer counted, though its `state` is still
    /// `.pending` and `cancel()` can still prevent the run.
    ///
    /// - Complexity: O(number of shards): takes each shard's lock in turn, so
    ///   while other threads arm and cancel the sum is not one instant's.
    public var pendingCount: Int { engine.pendingCount }
}
