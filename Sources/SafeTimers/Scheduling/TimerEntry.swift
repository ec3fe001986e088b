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

/// A counted reference to an armed entry in eight bytes: a wheel node keeps one
/// (an `any TimerEntry` takes sixteen, the object and its witness table, and
/// every pending timer has a node).
///
/// The object's address has its low three bits free (Swift objects are at least
/// 8-byte aligned); they hold the number ``TimerEntryClasses`` gave the entry's
/// class, through which the engine gets the entry back as a ``TimerEntry``.
///
/// Not a managed value: ``init(retaining:)`` counts one reference, and exactly one
/// of ``take()`` or ``release()`` gives it back.
struct TimerEntryReference {
    /// The object's address with its class's number; 0 when empty.
    private var bits: UInt

    static var none: TimerEntryReference { TimerEntryReference(bits: 0) }

    private init(bits: UInt) { self.bits = bits }

    /// Counts a reference to `entry`.
    @inline(__always)
    init<Entry: TimerEntry>(retaining entry: Entry) {
        let number = TimerEntryClasses.number(of: Entry.self)
        let address = UInt(bitPattern: Unmanaged.passRetained(entry).toOpaque())
        precondition(address & TimerEntryClasses.numberMask == 0, "a timer entry at a misaligned address")
        bits = address | number
    }

    var isNone: Bool { bits == 0 }

    private var address: UnsafeMutableRawPointer {
        UnsafeMutableRawPointer(bitPattern: bits & ~TimerEntryClasses.numberMask)!
    }

    private var number: UInt { bits & TimerEntryClasses.numberMask }

    /// The entry, with a reference of its own (the node keeps its reference).
    private var borrowed: any TimerEntry { TimerEntryClasses.entry(at: address, number: number, taking: false) }

    /// The entry's leeway.
    var leewayTicks: Int64 { borrowed.leewayTicks }

    /// The entry's slot (invariant checks).
    var timerSlot: Int { borrowed.timerSlot }

    /// Sets the entry's slot.
    func setTimerSlot(_ slot: Int) {
        let entry = borrowed
        entry.timerSlot = slot
    }

    /// Hands the counted reference over as an existential; empty afterwards.
    mutating func take() -> any TimerEntry {
        let entry = TimerEntryClasses.entry(at: address, number: number, taking: true)
        bits = 0
        return entry
    }

    /// Gives the counted reference back; empty afterwards.
    mutating func release() {
        guard bits != 0 else { return }
        Unmanaged<AnyObject>.fromOpaque(address).release()
        bits = 0
    }
}
