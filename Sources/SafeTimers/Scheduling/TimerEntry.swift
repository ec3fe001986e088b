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
/// (an `any TimerEntry` takes sixteen: the object and its witness table, and
/// every pending timer has a node).
///
/// The object's address has its low three bits free (Swift objects are at least
/// 8-byte aligned); they say which of SafeTimers' own entry classes it is, so
/// that the engine can call it without a witness table. Any other conformer (the
/// tests' entries) is kept in a small box holding the existential, tag 0.
///
/// Not a managed value: ``init(retaining:)`` counts one reference, and exactly one
/// of ``take()`` or ``release()`` gives it back.
struct TimerEntryReference {
    /// The object's address with its tag; 0 when empty.
    private(set) var bits: UInt

    static let none = TimerEntryReference(bits: 0)

    private init(bits: UInt) { self.bits = bits }

    private static let tagMask: UInt = 7

    /// The tag for `Entry`, or 0 when it goes in a box. Specialized per type:
    /// the comparisons fold to a constant.
    @inline(__always)
    private static func tag<Entry: TimerEntry>(for type: Entry.Type) -> UInt {
        if type == DelayedWork.self { return 1 }
        if type == RepeatingTimerCore.self { return 2 }
        if type == WatchdogCore.self { return 3 }
        if type == DebouncerCore.self { return 4 }
        if type == ThrottlerCore.self { return 5 }
        if type == ClockSleep.self { return 6 }
        if type == WatchdogSlot.self { return 7 }
        return 0
    }

    /// Counts a reference to `entry`.
    @inline(__always)
    init<Entry: TimerEntry>(retaining entry: Entry) {
        let tag = Self.tag(for: Entry.self)
        if tag == 0 {
            bits = UInt(bitPattern: Unmanaged.passRetained(TimerEntryBox(entry)).toOpaque())
        } else {
            let address = UInt(bitPattern: Unmanaged.passRetained(entry).toOpaque())
            precondition(address & Self.tagMask == 0, "a timer entry at a misaligned address")
            bits = address | tag
        }
    }

    var isNone: Bool { bits == 0 }

    private var address: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: bits & ~Self.tagMask)! }

    /// Calls `body` with the entry, borrowed (no reference counted).
    @inline(__always)
    private func with<Result>(_ body: (any TimerEntry) -> Result) -> Result {
        switch bits & Self.tagMask {
        case 1: return Unmanaged<DelayedWork>.fromOpaque(address)._withUnsafeGuaranteedRef { body($0) }
        case 2: return Unmanaged<RepeatingTimerCore>.fromOpaque(address)._withUnsafeGuaranteedRef { body($0) }
        case 3: return Unmanaged<WatchdogCore>.fromOpaque(address)._withUnsafeGuaranteedRef { body($0) }
        case 4: return Unmanaged<DebouncerCore>.fromOpaque(address)._withUnsafeGuaranteedRef { body($0) }
        case 5: return Unmanaged<ThrottlerCore>.fromOpaque(address)._withUnsafeGuaranteedRef { body($0) }
        case 6: return Unmanaged<ClockSleep>.fromOpaque(address)._withUnsafeGuaranteedRef { body($0) }
        case 7: return Unmanaged<WatchdogSlot>.fromOpaque(address)._withUnsafeGuaranteedRef { body($0) }
        default: return Unmanaged<TimerEntryBox>.fromOpaque(address)._withUnsafeGuaranteedRef { body($0.entry) }
        }
    }

    /// The entry's leeway (borrowed).
    var leewayTicks: Int64 { with { $0.leewayTicks } }

    /// The entry's slot (borrowed; invariant checks).
    var timerSlot: Int { with { $0.timerSlot } }

    /// Sets the entry's slot (borrowed).
    func setTimerSlot(_ slot: Int) {
        with { entry in entry.timerSlot = slot }
    }

    /// Hands the counted reference over as an existential; empty afterwards.
    mutating func take() -> any TimerEntry {
        let address = self.address
        let tag = bits & Self.tagMask
        bits = 0
        switch tag {
        case 1: return Unmanaged<DelayedWork>.fromOpaque(address).takeRetainedValue()
        case 2: return Unmanaged<RepeatingTimerCore>.fromOpaque(address).takeRetainedValue()
        case 3: return Unmanaged<WatchdogCore>.fromOpaque(address).takeRetainedValue()
        case 4: return Unmanaged<DebouncerCore>.fromOpaque(address).takeRetainedValue()
        case 5: return Unmanaged<ThrottlerCore>.fromOpaque(address).takeRetainedValue()
        case 6: return Unmanaged<ClockSleep>.fromOpaque(address).takeRetainedValue()
        case 7: return Unmanaged<WatchdogSlot>.fromOpaque(address).takeRetainedValue()
        default: return Unmanaged<TimerEntryBox>.fromOpaque(address).takeRetainedValue().entry
        }
    }

    /// Gives the counted reference back; empty afterwards.
    mutating func release() {
        guard bits != 0 else { return }
        Unmanaged<AnyObject>.fromOpaque(address).release()
        bits = 0
    }
}

/// Holds an entry of a type ``TimerEntryReference`` has no tag for.
final class TimerEntryBox: Sendable {
    let entry: any TimerEntry
    init(_ entry: any TimerEntry) { self.entry = entry }
}
