@testable import SafeTimers

/// The overlapping state machine (``OverlappingRepeatingTimerStateMachine``) in the same
/// world of steps as the real primitives: calls from the caller and from inside
/// the handler, the engine firing, deliveries beginning on a free worker,
/// handlers ending, time passing. Only the no-overlap invariant is checked.
struct OverlappingRepeatingTimerSystem: ExplorableSystem {
    typealias Machine = OverlappingRepeatingTimerStateMachine
    var machine = Machine(
        configuration: .init(interval: 10, repetitions: nil, firesImmediately: false, missedTicks: .coalesce))
    var now: Int64 = 0
    var armed: Int64?
    var deliveries: [UInt64] = []
    var running: [UInt: UInt64] = [:]
    var violation: String?

    init() {}

    func enabledSteps() -> [PrimitiveStep] {
        var steps: [PrimitiveStep] = []
        let callers = [PrimitiveWorld.caller] + PrimitiveWorld.workers.filter { running[$0] != nil }
        for thread in callers {
            for call in ["start", "suspend", "resume", "cancel"] { steps.append(.call(call, thread)) }
        }
        if armed != nil { steps.append(.fire) }
        steps.append(.elapse)
        if PrimitiveWorld.workers.contains(where: { running[$0] == nil }) {
            for index in deliveries.indices { steps.append(.begin(index)) }
        }
        for worker in PrimitiveWorld.workers where running[worker] != nil { steps.append(.end(worker)) }
        return steps
    }

    mutating func perform(_ step: PrimitiveStep) {
        switch step {
        case .call(let name, _):
            switch name {
            case "start": apply(machine.start(now: now))
            case "suspend": apply(machine.suspend())
            case "resume": apply(machine.resume(now: now))
            default: apply(machine.cancel())
            }
        case .fire:
            guard let deadline = armed else { return }
            now = max(now, deadline)
            armed = nil
            apply(machine.tick(deadline: deadline, now: now))
        case .elapse:
            now += 15
        case .begin(let index):
            let tag = deliveries.remove(at: index)
            let worker = PrimitiveWorld.workers.first { running[$0] == nil }!
            if machine.beginInvocation(tag: tag) {
                running[worker] = tag
                if running.count > 1 { violation = "two invocations of the handler overlap" }
            }
        case .end(let worker):
            if let tag = running.removeValue(forKey: worker) { apply(machine.endInvocation(tag: tag)) }
        case .unblock:
            break
        }
    }

    private mutating func apply(_ action: Machine.Action) {
        switch action.timer {
        case .arm(let deadline): armed = deadline
        case .disarm: armed = nil
        case .none: break
        }
        if action.deliver { deliveries.append(machine.generation) }
    }

    mutating func finish() -> String? { violation }
}
