import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

#if canImport(Glibc)
import Glibc
#endif

/// The sizes that make a pending `DelayedWork` 160 bytes (handle 96, closure
/// context 32, wheel node 32), and the wrap-around rules that the small fields
/// rely on. A size that grows fails here before a benchmark notices.
@Suite("Compact layout")
struct CompactLayoutTests {
    @Test("a wheel node is 32 bytes, a gate 15, a DelayedWork's locked state 40")
    func sizes() {
        #expect(MemoryLayout<TimerNode>.stride == 32)
        #expect(MemoryLayout<TimerEntry?>.size == 8)
        #expect(MemoryLayout<InvocationGate>.size <= 15)
        #expect(MemoryLayout<LockedMachine<DelayedWorkStateMachine>>.size <= 40)
    }

    #if os(Linux)
    @Test("a DelayedWork handle fits a 96-byte allocation (88 usable bytes)")
    func handleAllocation() {
        // Several handles, the smallest allocation counted: with other suites
        // allocating beside this one, malloc may hand one handle a larger chunk
        // it did not split (104 usable bytes was seen once).
        let works = (0..<32).map { _ in DelayedWork.schedule(after: .seconds(3600)) {} }
        defer { for work in works { work.cancel() } }
        // `malloc.h` is not in Swift's Glibc module: look the function up.
        typealias UsableSize = @convention(c) (UnsafeMutableRawPointer?) -> Int
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "malloc_usable_size") else {
            Issue.record("malloc_usable_size not found")
            return
        }
        let usableSize = unsafeBitCast(symbol, to: UsableSize.self)
        let usable = works.map { usableSize(Unmanaged.passUnretained($0).toOpaque()) }.min() ?? 0
        #expect(usable <= 88, "a DelayedWork now takes \(usable) usable bytes")
    }
    #endif

    @Test("tags wrap at 2^32: the gate still admits exactly the queued one")
    func tagsWrap() {
        var gate = InvocationGate(lastTag: UInt32.max - 1, ended: 0)
        var tags: [UInt64] = []
        for _ in 0..<4 {
            let tag = gate.deliver()!
            tags.append(tag)
            let second = gate.deliver()
            #expect(second == nil)  // one in flight
            let wrongTag = gate.begin(tag: tag &+ 1, thread: 9)
            let began = gate.begin(tag: tag, thread: 9)
            let again = gate.begin(tag: tag, thread: 9)  // never twice
            #expect(!wrongTag && began && !again)
            _ = gate.end()
        }
        #expect(tags == [UInt64(UInt32.max), 0, 1, 2])
    }

    @Test("a wait ticket taken just before the ended count wraps is passed by the end after it")
    func ticketsWrap() {
        for start in [UInt32.max - 1, UInt32.max, 0] {
            var gate = InvocationGate(lastTag: 0, ended: start)
            let tag = gate.deliver()!
            let began = gate.begin(tag: tag, thread: 3)
            #expect(began)
            let ticket = gate.waitTicket(thread: 4)!
            #expect(ticket.runner == 3)
            #expect(!gate.hasPassed(ticket))
            let waited = gate.end()
            #expect(waited)  // a waiter is registered
            #expect(gate.hasPassed(ticket))
            gate.leave()
            #expect(gate.waiters == 0)
        }
    }

    @Test("a cancel on the handler's own thread gets no ticket; other threads do, one each")
    func tickets() {
        var gate = InvocationGate()
        let tag = gate.deliver()!
        let began = gate.begin(tag: tag, thread: 5)
        #expect(began)
        let own = gate.waitTicket(thread: 5)
        #expect(own == nil)
        for thread in 6..<10 {
            let ticket = gate.waitTicket(thread: UInt(thread))
            #expect(ticket != nil)
        }
        #expect(gate.waiters == 4)
    }

    @Test("thread numbers: nonzero, below 2^32, stable on a thread, distinct across live threads")
    func threadNumbers() async {
        let mine = ThreadIdentity.current()
        #expect(mine != 0 && mine <= UInt(UInt32.max))
        #expect(ThreadIdentity.current() == mine)
        let numbers = StateLock<[UInt]>([])
        let ready = Atomic<Int>(0)
        let threads = 16
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let finished = Atomic<Int>(0)
            for _ in 0..<threads {
                NamedThread.start(name: "numbers") {
                    let number = ThreadIdentity.current()
                    numbers.withLock { $0.append(number) }
                    // Stay alive until every thread has its number, so none is reused.
                    ready.add(1, ordering: .relaxed)
                    while ready.load(ordering: .relaxed) < threads { sched_yield() }
                    #expect(ThreadIdentity.current() == number)
                    if finished.add(1, ordering: .relaxed).newValue == threads { done.resume() }
                }.detach()
            }
        }
        let all = numbers.withLock { $0 }
        #expect(Set(all + [mine]).count == threads + 1)
        #expect(all.allSatisfy { $0 != 0 && $0 <= UInt(UInt32.max) })
    }

    @Test("a wheel node counts exactly one reference to its entry, and gives it back when the entry leaves")
    func nodeReferences() {
        weak var testEntry: RecordingEntry?
        weak var workEntry: DelayedWork?
        do {
            var wheel = TimerWheel()
            let entry = RecordingEntry("test")
            testEntry = entry
            wheel.insert(entry, deadline: 1_000, sequence: 1)
            #expect(entry.timerSlot >= 0)
            let removed = wheel.remove(node: Int32(entry.timerSlot))
            #expect(removed === entry)
            #expect(entry.timerSlot == -1)
            #expect(wheel.count == 0)
        }
        #expect(testEntry == nil)
        do {
            let engine = TimerEngine(virtual: true)
            let work = DelayedWork.schedule(
                atTicks: DeadlineArithmetic.never, executor: .globalQueue, engine: engine
            ) {}
            workEntry = work
            #expect(work.leewayTicks == 0)
            #expect(engine.pendingCount == 1)
            work.cancel()
            #expect(engine.pendingCount == 0)
        }
        #expect(workEntry == nil)
    }

    /// An entry class per `Tag` (each specialization of a generic class is a
    /// class of its own to the runtime).
    protocol ArmableEntry: TimerEntry {
        func arm(_ engine: TimerEngine, at deadline: Int64)
        func disarm(_ engine: TimerEngine) -> Bool
    }

    final class TaggedEntry<Tag>: TimerEntry, ArmableEntry, @unchecked Sendable {
        private let armed = StateLock<UInt64>(0)
        let fired: Counter
        init(counting fired: Counter) { self.fired = fired }
        func arm(_ engine: TimerEngine, at deadline: Int64) { armed.withLock { $0 = engine.arm(self, at: deadline) } }
        func disarm(_ engine: TimerEngine) -> Bool {
            armed.withLock {
                $0 = 0
                return engine.disarm(self)
            }
        }
        override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
            if armed.withLock({ $0 }) == sequence { fired.increment() }
        }
    }
    enum T1 {}
    enum T2 {}
    enum T3 {}
    enum T4 {}
    enum T5 {}
    enum T6 {}
    enum T7 {}
    enum T8 {}
    enum T9 {}

    @Test("entries of nine classes are armed, fired, disarmed and released alike")
    func manyEntryClasses() {
        let engine = TimerEngine(virtual: true)
        let fired = Counter()
        var entries: [any ArmableEntry] = [
            TaggedEntry<T1>(counting: fired), TaggedEntry<T2>(counting: fired), TaggedEntry<T3>(counting: fired),
            TaggedEntry<T4>(counting: fired), TaggedEntry<T5>(counting: fired), TaggedEntry<T6>(counting: fired),
            TaggedEntry<T7>(counting: fired), TaggedEntry<T8>(counting: fired), TaggedEntry<T9>(counting: fired),
        ]
        weak let last = entries.last
        for (offset, entry) in entries.enumerated() { entry.arm(engine, at: Int64(offset + 1) * 1_000) }
        #expect(entries.allSatisfy { $0.timerSlot >= 0 })
        engine.advance(toTicks: 5_000)
        #expect(fired.count == 5)
        #expect(entries[8].disarm(engine))
        engine.advance(toTicks: 20_000)
        #expect(fired.count == 8)
        #expect(entries.allSatisfy { $0.timerSlot == -1 })
        entries.removeAll()
        #expect(last == nil)
    }

    @Test("a deadline of Int64.min is armed one tick later, fires first, and keeps the wheel sound")
    func minimumDeadline() {
        var wheel = TimerWheel()
        let first = RecordingEntry("min")
        let second = RecordingEntry("zero")
        wheel.insert(second, deadline: 0, sequence: 1)
        wheel.insert(first, deadline: Int64.min, sequence: 2)
        #expect(wheel.invariantViolation() == nil)
        let fired = wheel.popDue(now: 0)
        #expect(fired?.deadline == Int64.min + 1)
        #expect((fired?.entry as? RecordingEntry)?.name == "min")
        #expect(wheel.invariantViolation() == nil)
        _ = wheel.removeAll()
    }
}
