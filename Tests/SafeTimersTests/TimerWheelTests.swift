import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

@Suite("TimerWheel")
struct TimerWheelTests {
    /// A deadline of random magnitude (1 ns to 2^42 ns, about 73 minutes), so
    /// that every level of the wheel and the near heap get entries; now and then
    /// "never" or a deadline in the past.
    static func randomDeadline(after now: Int64, _ generator: inout SplitMix64) -> Int64 {
        switch generator.next() % 20 {
        case 0: return DeadlineArithmetic.never
        case 1: return now - Int64(generator.next() % 1_000_000)
        default:
            let bits = Int64(generator.next() % 43)
            return now + Int64(generator.next() % UInt64(1 << bits))
        }
    }

    @Test("pops in deadline order, equal deadlines in arming order, across every level")
    func ordering() {
        var wheel = TimerWheel()
        var generator = SplitMix64(seed: 7)
        var parked = 0
        for number in 0..<20_000 {
            let deadline =
                number % 3 == 0
                ? Int64(generator.next() % 50) << 30  // many equal deadlines
                : Self.randomDeadline(after: 0, &generator)
            if deadline == DeadlineArithmetic.never { parked += 1 }
            wheel.insert(RecordingEntry("\(number)"), deadline: deadline, sequence: UInt64(number))
        }
        #expect(wheel.invariantViolation() == nil)
        var previous: (Int64, UInt64) = (Int64.min, 0)
        var popped = 0
        while let fired = wheel.popDue(now: Int64.max - 1) {
            #expect(fired.entry.timerSlot == -1)
            #expect(previous.0 < fired.deadline || (previous.0 == fired.deadline && previous.1 < fired.sequence))
            previous = (fired.deadline, fired.sequence)
            popped += 1
        }
        #expect(popped == 20_000 - parked)
        #expect(wheel.count == parked)
        #expect(wheel.earliestDeadline() == (parked > 0 ? DeadlineArithmetic.never : nil))
        #expect(wheel.invariantViolation() == nil)
    }

    @Test("random arms, moves, disarms and advances fire exactly what a sorted model fires", arguments: [1, 2, 3, 4])
    func matchesModel(seed: UInt64) {
        var wheel = TimerWheel()
        var generator = SplitMix64(seed: seed)
        // The model: every armed entry's (deadline, sequence), by name.
        var model: [String: (deadline: Int64, sequence: UInt64)] = [:]
        var entries: [String: RecordingEntry] = [:]
        var now: Int64 = 0
        var sequence: UInt64 = 0
        for step in 0..<30_000 {
            sequence += 1
            switch generator.next() % 10 {
            case 0...3:
                let name = "e\(step)"
                let entry = RecordingEntry(name)
                let deadline = Self.randomDeadline(after: now, &generator)
                wheel.insert(entry, deadline: deadline, sequence: sequence)
                entries[name] = entry
                model[name] = (deadline, sequence)
            case 4 where !model.isEmpty, 5 where !model.isEmpty:
                let name = model.keys.randomElement(using: &generator)!
                let removed = wheel.remove(node: Int32(entries[name]!.timerSlot))
                #expect(removed === entries[name])
                #expect(entries[name]!.timerSlot == -1)
                model[name] = nil
                entries[name] = nil
            case 6 where !model.isEmpty:
                let name = model.keys.randomElement(using: &generator)!
                let deadline = Self.randomDeadline(after: now, &generator)
                wheel.update(node: Int32(entries[name]!.timerSlot), deadline: deadline, sequence: sequence)
                model[name] = (deadline, sequence)
            case 7:
                // The scheduler thread's look before it sleeps: it cascades ahead of
                // the clock, which must never make it sleep past a deadline.
                let target = wheel.wakeUpTarget()
                if let earliest = model.values.map(\.deadline).min() {
                    #expect(target <= earliest)
                }
            default:
                // Advance by a random amount, from nothing to about 4 minutes.
                now += Int64(generator.next() % UInt64(1 << (generator.next() % 38)))
                Self.popDue(&wheel, now: now, model: &model, entries: &entries)
            }
            if step % 1_000 == 0 {
                #expect(wheel.invariantViolation() == nil)
                #expect(wheel.count == model.count)
            }
        }
        let earliest = model.values.map(\.deadline).min()
        #expect(wheel.earliestDeadline() == earliest)
        #expect(wheel.invariantViolation() == nil)
        _ = wheel.removeAll()
        #expect(wheel.count == 0)
        #expect(entries.values.allSatisfy { $0.timerSlot == -1 })
    }

    /// Pops every entry due at `now`: exactly the model's, in deadline then
    /// sequence order; they leave the model.
    private static func popDue(
        _ wheel: inout TimerWheel, now: Int64, model: inout [String: (deadline: Int64, sequence: UInt64)],
        entries: inout [String: RecordingEntry]
    ) {
        let expected = model.filter { $0.value.deadline <= now }
            .sorted { ($0.value.deadline, $0.value.sequence) < ($1.value.deadline, $1.value.sequence) }
            .map(\.key)
        var fired: [String] = []
        while let element = wheel.popDue(now: now) {
            let name = (element.entry as! RecordingEntry).name
            #expect(model[name]?.deadline == element.deadline && model[name]?.sequence == element.sequence)
            fired.append(name)
            model[name] = nil
            entries[name] = nil
        }
        #expect(fired == expected)
    }

    @Test("the scheduler thread's wake-up target respects leeway, the near heap and the next bucket")
    func wakeUpTarget() {
        var wheel = TimerWheel()
        #expect(wheel.wakeUpTarget() == DeadlineArithmetic.never)
        wheel.insert(RecordingEntry("parked"), deadline: DeadlineArithmetic.never, sequence: 1)
        #expect(wheel.wakeUpTarget() == DeadlineArithmetic.never)
        // Far away: the thread wakes at the entry's deadline (the earliest its
        // bucket holds), not at the bucket's start before it.
        let hour: Int64 = 3_600_000_000_000
        let hourEntry = RecordingEntry("hour")
        wheel.insert(hourEntry, deadline: hour, sequence: 2)
        #expect(wheel.wakeUpTarget() == hour)
        // An earlier entry in the same bucket lowers the target; once it leaves,
        // the bound may stay early (one spare wake-up), never late.
        let earlier = RecordingEntry("earlier")
        wheel.insert(earlier, deadline: hour - 1_000, sequence: 3)
        #expect(wheel.wakeUpTarget() == hour - 1_000)
        _ = wheel.remove(node: Int32(earlier.timerSlot))
        #expect(wheel.wakeUpTarget() <= hour)
        _ = wheel.remove(node: Int32(hourEntry.timerSlot))
        #expect(wheel.wakeUpTarget() == DeadlineArithmetic.never)
        // Due now (in the near heap): its deadline, plus leeway up to the next deadline.
        wheel.insert(LeewayEntry(leeway: 5_000), deadline: 100, sequence: 3)
        #expect(wheel.wakeUpTarget() == 5_100)
        wheel.insert(RecordingEntry("soon"), deadline: 2_000, sequence: 4)
        #expect(wheel.wakeUpTarget() == 2_000)
        #expect(wheel.invariantViolation() == nil)
    }

    /// Drives a wheel the way the scheduler thread does, with one repeating entry
    /// of `period` ns that re-arms from its previous deadline, and counts the
    /// thread's wake-ups per firing.
    private func wakeUpsPerFiring(period: Int64, start: Int64, firings: Int) -> Double {
        var wheel = TimerWheel()
        let entry = RecordingEntry("repeating")
        var now = start
        var deadline = start + period
        var sequence: UInt64 = 1
        wheel.insert(entry, deadline: deadline, sequence: sequence)
        var fired = 0
        var wakeUps = 0
        while fired < firings {
            while let due = wheel.popDue(now: now) {
                #expect(due.deadline <= now)
                #expect(now == due.deadline, "fired late: \(now - due.deadline) ns")
                fired += 1
                deadline += period
                sequence += 1
                wheel.insert(due.entry, deadline: deadline, sequence: sequence)
            }
            let target = wheel.wakeUpTarget()
            #expect(target > now)
            now = target
            wakeUps += 1
        }
        _ = wheel.removeAll()
        return Double(wakeUps) / Double(fired)
    }

    @Test(
        "a repeating timer of any period wakes the scheduler thread once per firing",
        arguments: [
            20_000_000, 50_000_000, 100_000_000, 250_000_000, 1_000_000_000, 10_000_000_000,
            3_600_000_000_000,
        ] as [Int64])
    func wakeUpsPerPeriod(period: Int64) {
        for start: Int64 in [0, 12_345_678_901, 987_654_321] {
            let perFiring = wakeUpsPerFiring(period: period, start: start, firings: 200)
            #expect(perFiring <= 1.01, "\(perFiring) wake-ups per firing of a \(period / 1_000_000) ms timer")
        }
    }

    final class ModelEntry: TimerEntry, @unchecked Sendable {
        let id: Int
        init(id: Int) { self.id = id }
        override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {}
    }

    typealias Model = [Int: (deadline: Int64, sequence: UInt64, entry: ModelEntry)]

    /// Pops every entry due at `now`, each the model's earliest (never one
    /// early, its slot released), until none is due; false after recording the
    /// first mismatch.
    private static func popDueAgainstModel(
        _ wheel: inout TimerWheel, now: Int64, model: inout Model, step: Int
    ) -> Bool {
        while let fired = wheel.popDue(now: now) {
            let expected = model.values.filter { $0.deadline != Int64.max }
                .min { ($0.deadline, $0.sequence) < ($1.deadline, $1.sequence) }
            guard let expected else {
                Issue.record("step \(step): popped \(fired.deadline) from an empty model")
                return false
            }
            if fired.deadline != expected.deadline || fired.sequence != expected.sequence
                || (fired.entry as? ModelEntry)?.id != expected.entry.id
            {
                Issue.record(
                    "step \(step): popped (\(fired.deadline), \(fired.sequence)) expected (\(expected.deadline), \(expected.sequence)) now \(now)"
                )
                return false
            }
            if fired.deadline > now { Issue.record("step \(step): early \(fired.deadline) > \(now)"); return false }
            if fired.entry.timerSlot != -1 { Issue.record("step \(step): popped entry still has a slot") }
            model[expected.entry.id] = nil
        }
        let dueLeft = model.values.contains { $0.deadline <= now && $0.deadline != Int64.max }
        if dueLeft { Issue.record("step \(step): due entry not popped at now \(now)"); return false }
        return true
    }

    /// Whether the wheel's earliest deadline is the model's; records it if not.
    private static func earliestMatches(_ wheel: inout TimerWheel, model: Model, step: Int) -> Bool {
        let earliest = wheel.earliestDeadline()
        let expected = model.values.map(\.deadline).min()
        guard earliest != expected else { return true }
        Issue.record("step \(step): earliest \(String(describing: earliest)) expected \(String(describing: expected))")
        return false
    }

    /// Whether the wheel still holds its invariants and the model's count;
    /// records the first that does not.
    private static func stillMatches(_ wheel: borrowing TimerWheel, model: Model, step: Int) -> Bool {
        if let violation = wheel.invariantViolation() {
            Issue.record("step \(step): \(violation)")
            return false
        }
        guard wheel.count == model.count else {
            Issue.record("step \(step): count \(wheel.count) model \(model.count)")
            return false
        }
        return true
    }

    /// Random arm/move/disarm/pop/earliest sequences against a model, with
    /// extreme deadlines mixed in.
    @Test(arguments: 0..<8) func wheelAgainstModel(_ seed: Int) {
        var wheel = TimerWheel()
        var model: Model = [:]
        var sequence: UInt64 = 0
        var now: Int64 = 0
        var rng = SplitMix64(seed: UInt64(seed) &+ 12345)
        let extremes: [Int64] = [
            Int64.min, Int64.min + 1, -1, 0, 1, Int64.max, Int64.max - 1, (1 << 62), -(1 << 40), (1 << 43) - 1,
            1 << 20, (1 << 20) - 1, 64 << 20, (64 << 20) - 1, 4096 << 20,
        ]
        func randomDeadline() -> Int64 {
            switch rng.next() % 6 {
            case 0: return extremes[Int(rng.next() % UInt64(extremes.count))]
            case 1: return now &+ Int64(rng.next() % (1 << 22))
            case 2: return now &+ Int64(rng.next() % (1 << 34))
            case 3: return now &- Int64(rng.next() % (1 << 24))
            case 4: return now &+ Int64(rng.next() % (1 << 50))
            default: return now &+ Int64(rng.next() % (1 << 28))
            }
        }
        var nextID = 0
        for step in 0..<20_000 {
            let op = rng.next() % 10
            if op < 4 || model.isEmpty {
                let entry = ModelEntry(id: nextID)
                nextID += 1
                sequence += 1
                let deadline = randomDeadline()
                wheel.insert(entry, deadline: deadline, sequence: sequence)
                model[entry.id] = (max(deadline, Int64.min + 1), sequence, entry)
            } else if op < 6 {
                let key = Array(model.keys)[Int(rng.next() % UInt64(model.count))]
                let item = model[key]!
                sequence += 1
                let deadline = randomDeadline()
                wheel.update(
                    node: Int32(truncatingIfNeeded: item.entry.timerSlot), deadline: deadline, sequence: sequence)
                model[key] = (max(deadline, Int64.min + 1), sequence, item.entry)
            } else if op < 7 {
                let key = Array(model.keys)[Int(rng.next() % UInt64(model.count))]
                let item = model[key]!
                let removed = wheel.remove(node: Int32(truncatingIfNeeded: item.entry.timerSlot))
                #expect((removed as? ModelEntry)?.id == key)
                model[key] = nil
            } else if op < 9 {
                if rng.next() % 20 == 0 {
                    now = min(now &+ Int64(rng.next() % (1 << 45)), Int64.max - 2)
                } else {
                    now = now &+ Int64(rng.next() % (1 << 23))
                }
                guard Self.popDueAgainstModel(&wheel, now: now, model: &model, step: step) else { return }
            } else if !Self.earliestMatches(&wheel, model: model, step: step) {
                return
            }
            guard Self.stillMatches(wheel, model: model, step: step) else { return }
        }
        _ = wheel.removeAll()
    }
}

/// An entry that may fire up to `leeway` nanoseconds late.
final class LeewayEntry: TimerEntry, @unchecked Sendable {
    let leeway: Int64
    init(leeway: Int64) { self.leeway = leeway }
    override var leewayTicks: Int64 { leeway }
    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {}
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
