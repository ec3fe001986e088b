import Synchronization

/// Numbers for the classes of armed entries, so that a node names its entry's
/// class in the three free bits of the entry's address and the engine reaches
/// the entry through ``TimerEntry`` alone: without a witness table in every node,
/// and without knowing which classes exist.
///
/// A class is numbered (1 to 7) the first time one of its objects is armed; the
/// number indexes the two functions made for the class then, which turn an
/// address back into an `any TimerEntry`. Arming looks its class up among the
/// seven numbers (a few loads); firing makes one indirect call. Classes beyond
/// the seventh get 0 and are reached through a dynamic cast (a conformance
/// lookup, about ten times the call). SafeTimers has eight classes of entry, one
/// of them (`HopRescue`) armed only when a delivery batch stalls, so a process
/// rarely has more than seven; the tests' own entry classes add to them.
enum TimerEntryClasses {
    /// The bits of an entry's address that hold its class's number.
    static let numberMask: UInt = 7

    /// The classes numbered 1 to 7 (their metadata addresses); 0 while free.
    /// Separate `Atomic` globals, which are initialized statically: arming reads
    /// them without a `swift_once`.
    private static let class1 = Atomic<UInt>(0)
    private static let class2 = Atomic<UInt>(0)
    private static let class3 = Atomic<UInt>(0)
    private static let class4 = Atomic<UInt>(0)
    private static let class5 = Atomic<UInt>(0)
    private static let class6 = Atomic<UInt>(0)
    private static let class7 = Atomic<UInt>(0)

    /// The metadata address of the class numbered `number`.
    private static func metadata(numbered number: UInt) -> UInt {
        switch number {
        case 1: class1.load(ordering: .acquiring)
        case 2: class2.load(ordering: .acquiring)
        case 3: class3.load(ordering: .acquiring)
        case 4: class4.load(ordering: .acquiring)
        case 5: class5.load(ordering: .acquiring)
        case 6: class6.load(ordering: .acquiring)
        default: class7.load(ordering: .acquiring)
        }
    }

    /// How to get an entry of one numbered class back from its address.
    private struct Opener {
        /// From a counted reference, which the result takes over.
        let taking: (UnsafeMutableRawPointer) -> any TimerEntry
        /// Counting a new reference for the result.
        let borrowing: (UnsafeMutableRawPointer) -> any TimerEntry

        init<Entry: TimerEntry>(_ type: Entry.Type) {
            taking = { Unmanaged<Entry>.fromOpaque($0).takeRetainedValue() }
            borrowing = { Unmanaged<Entry>.fromOpaque($0).takeUnretainedValue() }
        }
    }

    /// The openers by number (index 0 unused). Written once per number, under
    /// ``registration``, before the number's class is published with a
    /// releasing store; read only for a node that carries the number, which was
    /// made after an acquiring load saw the class.
    nonisolated(unsafe) private static let openers = UnsafeMutablePointer<Opener?>.allocate(capacity: 8)
    private static let registration = StateLock<Bool>(false)

    /// The number of `Entry`'s class, numbering it if it has none yet.
    @inline(__always)
    static func number<Entry: TimerEntry>(of type: Entry.Type) -> UInt {
        let metadata = UInt(bitPattern: ObjectIdentifier(type))
        if class1.load(ordering: .acquiring) == metadata { return 1 }
        if class2.load(ordering: .acquiring) == metadata { return 2 }
        if class3.load(ordering: .acquiring) == metadata { return 3 }
        return numberBeyondThird(of: type)
    }

    @inline(never)
    private static func numberBeyondThird<Entry: TimerEntry>(of type: Entry.Type) -> UInt {
        let metadata = UInt(bitPattern: ObjectIdentifier(type))
        for number: UInt in 4...7 {
            let numbered = self.metadata(numbered: number)
            if numbered == metadata { return number }
            if numbered == 0 { break }
        }
        return register(type)
    }

    /// Numbers `Entry`'s class: the first free number, or 0 when all are taken.
    @inline(never)
    private static func register<Entry: TimerEntry>(_ type: Entry.Type) -> UInt {
        let metadata = UInt(bitPattern: ObjectIdentifier(type))
        return registration.withLock { initialized in
            if !initialized {
                openers.initialize(repeating: nil, count: 8)
                initialized = true
            }
            for number: UInt in 1...7 {
                let numbered = self.metadata(numbered: number)
                if numbered == metadata { return number }
                guard numbered == 0 else { continue }
                openers[Int(number)] = Opener(type)
                publish(metadata, as: number)
                return number
            }
            return 0
        }
    }

    private static func publish(_ metadata: UInt, as number: UInt) {
        switch number {
        case 1: class1.store(metadata, ordering: .releasing)
        case 2: class2.store(metadata, ordering: .releasing)
        case 3: class3.store(metadata, ordering: .releasing)
        case 4: class4.store(metadata, ordering: .releasing)
        case 5: class5.store(metadata, ordering: .releasing)
        case 6: class6.store(metadata, ordering: .releasing)
        default: class7.store(metadata, ordering: .releasing)
        }
    }

    /// The entry at `address`, of the class numbered `number`: taking over the
    /// reference counted for it, or counting a new one.
    static func entry(at address: UnsafeMutableRawPointer, number: UInt, taking: Bool) -> any TimerEntry {
        if number != 0, let opener = openers[Int(number)] {
            return taking ? opener.taking(address) : opener.borrowing(address)
        }
        let object = Unmanaged<AnyObject>.fromOpaque(address)
        // Every object in a node came in through `TimerEntryReference(retaining:)`.
        return (taking ? object.takeRetainedValue() : object.takeUnretainedValue()) as! any TimerEntry
    }
}
