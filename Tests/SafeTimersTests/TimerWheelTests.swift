import Testing

@testable @_spi(SchedulerImplementation) @_spi(SafeTimersInternal) import SafeTimers

@Suite("TimerHeap")
struct TimerHeapTests {
    @Test("pops in deadline order, equal deadlines in insertion order")
    func ordering() {
        var heap = TimerHeap()
        var generator = SplitMix64(seed: 7)
        var entries: [RecordingEntry] = []
        for number in 0..<2_000 {
            let entry = RecordingEntry("\(number)")
            entries.append(entry)
            heap.insert(entry, deadline: Int64(generator.next() % 50), sequence: UInt64(number))
        }
        #expect(heap.invariantViolation() == nil)
        var previous: (Int64, UInt64) = (Int64.min, 0)
        while !heap.isEmpty {
            let element = heap.removeFirst()
            #expect(element.entry.heapIndex == -1)
            #expect(previous.0 < element.deadline || (previous.0 == element.deadline && previous.1 < element.sequence))
            previous = (element.deadline, element.sequence)
        }
    }

    @Test("removing and updating arbitrary entries keeps every stored index right")
    func randomRemovalsAndUpdates() {
        var heap = TimerHeap()
        var generator = SplitMix64(seed: 42)
        var live: [RecordingEntry] = []
        var sequence: UInt64 = 0
        for _ in 0..<20_000 {
            sequence += 1
            switch generator.next() % 4 {
            case 0, 1:
                let entry = RecordingEntry("e")
                heap.insert(entry, deadline: Int64(generator.next() % 1_000), sequence: sequence)
                live.append(entry)
            case 2 where !live.isEmpty:
                let victim = live.remove(at: Int(generator.next() % UInt64(live.count)))
                heap.remove(at: victim.heapIndex)
                #expect(victim.heapIndex == -1)
            case 3 where !live.isEmpty:
                let moved = live[Int(generator.next() % UInt64(live.count))]
                heap.update(at: moved.heapIndex, deadline: Int64(generator.next() % 1_000), sequence: sequence)
            default:
                break
            }
        }
        #expect(heap.invariantViolation() == nil)
        #expect(heap.count == live.count)
    }
}

/// A small deterministic generator for property tests (reproducible by seed).
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
