import Synchronization

/// Something a scheduler's engine can arm: the storage object of a primitive
/// (a ``DelayedWork``, a ``Watchdog``'s or a ``RepeatingTimer``'s storage, a
/// clock's sleep).
///
/// Nothing of it is public: it is public only because ``DelayedWork``, its own
/// storage, is a subclass, and a public class's superclass must be public. It
/// cannot be created or subclassed outside SafeTimers.
///
/// The engine keeps an armed entry as one counted reference in the entry's wheel
/// node (eight bytes), and fires it with a direct call of its internal
/// `timerFired(deadline:sequence:engine:)`. The entry keeps the number of its
/// node (`timerSlot`), so that cancelling goes straight to the node: no search,
/// no extra allocation. An entry is armed
/// in at most one engine at a time; arming it again moves it.
///
/// `@unchecked Sendable` invariant: the only stored property here is an atomic.
/// A subclass must restate the conformance and say why its own stored
/// properties are safe to share (the compiler checks a final class only when it
/// has no superclass).
public class TimerEntry: @unchecked Sendable {
    private let slot = Atomic<Int>(-1)

    init() {}

    /// Where the entry is armed: the engine's shard number in the upper 32 bits
    /// and its node in that shard's ``TimerWheel`` in the lower 32; `-1` when it
    /// is not armed.
    ///
    /// Written only by ``TimerEngine`` (through its wheels) while it holds the
    /// lock of the shard that holds (or takes) the entry; read by the engine
    /// before it takes that lock (to find the shard) and again after. Relaxed:
    /// the shard's lock provides the ordering.
    final var timerSlot: Int {
        @inline(__always) get { slot.load(ordering: .relaxed) }
        @inline(__always) set { slot.store(newValue, ordering: .relaxed) }
    }

    /// How late the engine may fire this entry, in nanoseconds, so that one
    /// wake-up can serve several nearby deadlines. Never negative; 0 (this
    /// default) means "at the deadline".
    var leewayTicks: Int64 { 0 }

    /// Called once the deadline armed as `sequence` has passed.
    ///
    /// The engine calls this **outside** its lock: on the scheduler thread for a
    /// ``SystemTimerScheduler``, on the thread calling `advance(by:)` for a manual
    /// scheduler. The entry may have been cancelled or re-armed since it was
    /// taken out of the wheel; it compares `sequence` with the one ``TimerEngine/arm(_:at:)``
    /// returned to decide whether this call is still current. Every subclass
    /// overrides it; this one does nothing.
    func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {}
}
