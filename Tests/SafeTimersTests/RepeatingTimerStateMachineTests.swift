import Testing

@testable import SafeTimers

/// Property tests over random input sequences of the pure state machine: whatever
/// the order, its bookkeeping stays consistent.
@Suite("RepeatingTimerStateMachine (properties)")
struct RepeatingTimerStateMachineTests {
    typealias Machine = RepeatingTimerStateMachine
    static let worker: UInt = 7
    static let caller: UInt = 8

    @Test("a tick n intervals late keeps the grid and owes per policy")
    func lateTick() {
        func machine(_ policy: MissedTickPolicy) -> Machine {
            var machine = Machine(
                configuration: .init(interval: 1_000, repetitions: nil, firesImmediately: false, missedTicks: policy))
            _ = machine.start(now: 0)
            return machine
        }
        for (policy, owedAfter) in [(MissedTickPolicy.skip, 0), (.coalesce, 0), (.catchUp(limit: 100), 3)] {
            var m = machine(policy)
            let effects = m.tick(deadline: 1_000, now: 4_500)
            #expect(effects.timer == .arm(5_000), "next deadline on the grid, after now")
            #expect(effects.deliver != nil)
            #expect(m.owed == owedAfter, "\(policy)")
        }
    }

    @Test("a huge lateness saturates instead of overflowing")
    func hugeLateness() {
        var m = Machine(
            configuration: .init(
                interval: 1_000_000, repetitions: nil, firesImmediately: false, missedTicks: .catchUp(limit: 5)))
        _ = m.start(now: 0)
        let effects = m.tick(deadline: 1_000_000, now: Int64.max - 1)
        #expect(effects.deliver != nil)
        #expect(m.owed == 4)
        if case .arm(let next) = effects.timer { #expect(next > Int64.max - 1_000_000) }
    }

    @Test("suspend and resume while the handler runs never deliver a second invocation beside it")
    func suspendResumeWhileRunning() {
        var m = Machine(
            configuration: .init(interval: 10, repetitions: nil, firesImmediately: false, missedTicks: .coalesce))
        _ = m.start(now: 0)
        let tag = m.tick(deadline: 10, now: 10).deliver!
        #expect(m.begin(tag: tag, thread: Self.worker).number == 1)
        _ = m.suspend()
        _ = m.resume(now: 11)
        let late = m.tick(deadline: 21, now: 21)
        #expect(late.deliver == nil, "the handler still runs: the tick is owed, not delivered")
        #expect(m.owed == 1)
        let ended = m.end()
        #expect(ended.deliver != nil, "the owed invocation goes once the handler returned")
    }

    @Test("random input sequences keep every invariant", arguments: 0..<20)
    func randomSequences(seed: Int) {
        var random = SplitMix64(seed: UInt64(seed))
        let policies: [MissedTickPolicy] = [.skip, .coalesce, .catchUp(limit: 3)]
        let repetitions: Int? = seed % 3 == 0 ? nil : Int(random.next() % 6)
        var m = Machine(
            configuration: .init(
                interval: 10, repetitions: repetitions, firesImmediately: seed % 2 == 0,
                missedTicks: policies[seed % 3]))
        var now: Int64 = 0
        var armed: Int64? = nil
        var queued: [UInt64] = []  // delivered invocations not yet begun
        var running = false
        var begunSinceStart = 0
        for _ in 0..<2_000 {
            now += Int64(random.next() % 25)
            let effects: MachineEffects
            switch random.next() % 8 {
            case 0:
                if [.idle, .cancelled, .finished].contains(m.state) { begunSinceStart = 0 }
                effects = m.start(now: now)
            case 1: effects = m.suspend()
            case 2: effects = m.resume(now: now)
            case 3: effects = m.cancel(thread: running ? Self.worker : Self.caller)
            case 4, 5:
                guard let deadline = armed, deadline <= now else { continue }
                armed = nil
                effects = m.tick(deadline: deadline, now: now)
            default:
                if running {
                    running = false
                    effects = m.end()
                } else if !queued.isEmpty {
                    let tag = queued.removeFirst()
                    if m.begin(tag: tag, thread: Self.worker).number != nil {
                        running = true
                        begunSinceStart += 1
                    }
                    continue
                } else {
                    continue
                }
            }
            switch effects.timer {
            case .arm(let deadline):
                #expect(deadline >= now - 25, "never armed in the past beyond one step")
                armed = deadline
            case .disarm: armed = nil
            case .keep: break
            }
            if let tag = effects.deliver { queued.append(tag) }
            #expect(m.owed >= 0)
            #expect(m.fireCount == begunSinceStart)
            if let remaining = m.remaining { #expect(remaining >= 0) }
            #expect(m.isArmed == (armed != nil))
            if m.state != .running { #expect(m.owed == 0) }
            if effects.stopped { #expect(m.state == .cancelled || m.state == .finished) }
        }
    }
}
