import Testing

@testable @_spi(SafeTimersInternal) import SafeTimers

/// Property tests over random input sequences of the pure state machine: whatever
/// the order, its bookkeeping stays consistent.
@Suite("RepeatingTimerStateMachine (properties)")
struct RepeatingTimerStateMachineTests {
    typealias Machine = RepeatingTimerStateMachine

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
            let action = m.tick(deadline: 1_000, now: 4_500)
            #expect(action.timer == .arm(5_000), "next deadline on the grid, after now")
            #expect(action.deliver)
            #expect(m.owed == owedAfter, "\(policy)")
        }
    }

    @Test("a huge lateness saturates instead of overflowing")
    func hugeLateness() {
        var m = Machine(
            configuration: .init(
                interval: 1_000_000, repetitions: nil, firesImmediately: false, missedTicks: .catchUp(limit: 5)))
        _ = m.start(now: 0)
        let action = m.tick(deadline: 1_000_000, now: Int64.max - 1)
        #expect(action.deliver)
        #expect(m.owed == 4)
        if case .arm(let next) = action.timer { #expect(next > Int64.max - 1_000_000) }
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
        var running: UInt64? = nil
        for _ in 0..<2_000 {
            now += Int64(random.next() % 25)
            let action: Machine.Action
            switch random.next() % 8 {
            case 0: action = m.start(now: now)
            case 1: action = m.suspend()
            case 2: action = m.resume(now: now)
            case 3: action = m.cancel()
            case 4, 5:
                guard let deadline = armed, deadline <= now else { continue }
                armed = nil
                action = m.tick(deadline: deadline, now: now)
            default:
                if let tag = running {
                    running = nil
                    action = m.endInvocation(tag: tag)
                } else if !queued.isEmpty {
                    let tag = queued.removeFirst()
                    if m.beginInvocation(tag: tag) { running = tag }
                    continue
                } else {
                    continue
                }
            }
            switch action.timer {
            case .arm(let deadline):
                #expect(deadline >= now - 25, "never armed in the past beyond one step")
                armed = deadline
            case .disarm: armed = nil
            case .none: break
            }
            if action.deliver { queued.append(m.generation) }
            #expect(m.owed >= 0)
            #expect(m.fireCount >= 0)
            if let repetitions { #expect(m.delivered + m.owed <= max(0, repetitions)) }
            #expect(m.fireCount <= m.delivered || m.state != .running)
            if m.state != .running { #expect(m.owed == 0 || m.state == .finished) }
            if action.stopped { #expect(m.state == .cancelled || m.state == .finished) }
        }
    }
}
