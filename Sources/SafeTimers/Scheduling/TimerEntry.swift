/// Something an engine can arm: in practice the storage object of a primitive
/// (a `DelayedWork`, a `Watchdog`'s or a `RepeatingTimer`'s storage).
///
/// The engine keeps the number of the entry's node in its wheel *inside the
/// entry*, so that cancelling goes straight to the node: no search, no extra
/// allocation. An entry is armed in at most one engine at a time; arming it
/// again moves it.
protocol TimerEntry: AnyObject, Sendable {
    /// Where the entry is armed: the engine's shard number in the upper 32 bits
    /// and its node in that shard's ``TimerWheel`` in the lower 32; `-1` when it
    /// is not armed.
    ///
    /// Written only by ``TimerEngine`` while it holds the lock of the shard that
    /// holds (or takes) the entry; read by the engine before it takes that lock
    /// (to find the shard) and again after. Conformers store it in an
    /// `Atomic<Int>` accessed with relaxed ordering (the shard's lock provides
    /// the ordering), which keeps them checked `Sendable`.
    var timerSlot: Int { get set }

    /// How late the engine may fire this entry, in nanoseconds, so that one wake-up
    /// can serve several nearby deadlines. Never negative; 0 means "at the deadline".
    var leewayTicks: Int64 { get }

    /// Called once the deadline armed as `sequence` has passed.
    ///
    /// The engine calls this **outside** its lock: on the scheduler thread for a
    /// ``SystemTimerScheduler``, on the thread calling `advance(by:)` for a manual
    /// scheduler. The entry may have been cancelled or re-armed since it was
    /// taken out of the wheel; it compares `sequence` with the one ``TimerEngine/arm(_:at:)``
    /// returned to decide whether this call is still current.
    func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine)
}

extension TimerEntry {
    var leewayTicks: Int64 { 0 }
}
