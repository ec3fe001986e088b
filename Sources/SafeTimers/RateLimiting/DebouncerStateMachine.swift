/// The pure state machine of a ``Debouncer``: no lock, no clock, no engine.
///
/// | input | effects |
/// |---|---|
/// | call at `now` | the action replaces the pending one (released); a queued, not begun run is revoked; arm now + delay |
/// | deadline passed | deliver if nothing is in flight, otherwise run right after the running action ends |
/// | begin (the delivered tag) | the pending action is taken out to run |
/// | end | if the deadline passed meanwhile, deliver |
/// | flush | disarm; deliver the pending action now (or right after the running one) |
/// | cancel | release the pending action, revoke, disarm; wait for a running action on another thread |
///
/// So the actions never overlap, and exactly one run follows each quiet period.
struct DebouncerStateMachine: GatedStateMachine, Sendable {
    /// The latest call's action, until it runs.
    private var pending: (@Sendable () -> Void)?
    /// The deadline passed (or flush was called) while an action was in flight.
    private(set) var isDue = false
    var gate = InvocationGate()

    /// Whether an action waits to run.
    var hasPending: Bool { pending != nil }

    mutating func call(_ action: @escaping @Sendable () -> Void, deadline: Int64) -> MachineEffects {
        gate.revoke()
        isDue = false
        defer { pending = action }
        return MachineEffects(timer: .arm(deadline), released: pending)
    }

    /// The armed deadline passed.
    mutating func deadlinePassed() -> MachineEffects {
        guard pending != nil else { return MachineEffects() }
        return deliverOrMarkDue()
    }

    /// `flush()`: the pending action runs now.
    mutating func flush() -> MachineEffects {
        guard pending != nil, gate.queued == nil else { return MachineEffects() }
        var effects = deliverOrMarkDue()
        effects.timer = .disarm
        return effects
    }

    mutating func begin(tag: UInt64, thread: UInt) -> (@Sendable () -> Void)? {
        guard pending != nil, gate.begin(tag: tag, thread: thread) else { return nil }
        defer { pending = nil }
        return pending
    }

    mutating func end() -> MachineEffects {
        let wake = gate.end()
        var effects = isDue && pending != nil ? deliverOrMarkDue() : MachineEffects()
        effects.wake = wake
        return effects
    }

    mutating func cancel(thread: UInt) -> MachineEffects {
        gate.revoke()
        isDue = false
        defer { pending = nil }
        return MachineEffects(
            timer: .disarm, released: pending, waitFor: gate.waitTicket(thread: thread), prevented: pending != nil)
    }

    private mutating func deliverOrMarkDue() -> MachineEffects {
        if let tag = gate.deliver() {
            isDue = false
            return MachineEffects(deliver: tag)
        }
        isDue = true
        return MachineEffects()
    }
}
