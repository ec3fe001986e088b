/// An action handed to a ``Debouncer`` or a ``Throttler``, and where it runs.
struct RateLimitedAction: Sendable {
    let run: @Sendable () -> Void
    /// Run on the main actor instead of the primitive's queue.
    let onMainActor: Bool
}

/// The pure state machine of a ``Debouncer``: no lock, no clock, no engine.
///
/// A *burst* is a run of calls, each less than `delay` after the previous; it
/// ends (its *quiet period* is over) `delay` after its last call.
///
/// | input | effects |
/// |---|---|
/// | call, leading and no burst open, nothing in flight | the action is queued to run now; the burst opens |
/// | call otherwise | the action replaces the pending one (released); a queued trailing run that has not begun is revoked; arm now + delay |
/// | deadline passed (quiet period over) | the burst closes; deliver the pending action, or run it right after the running one ends |
/// | begin (the delivered tag) | the queued action is taken out to run |
/// | end | if the quiet period passed meanwhile (or flush), deliver the pending action |
/// | flush | disarm, close the burst; deliver the pending action now (or right after the running one) |
/// | cancel | release the pending and queued actions, revoke, disarm; wait for a running action on another thread |
///
/// So the actions never overlap, at most one trailing run follows each quiet
/// period, and with `leading` the first call of a burst runs at once (a burst of
/// one call runs once, not twice).
struct DebouncerStateMachine: GatedStateMachine, Sendable {
    let leading: Bool
    /// The latest call's action, until it is handed over to run.
    private var pending: RateLimitedAction?
    /// The action the queued delivery runs, and whether it is a leading run.
    private var queuedAction: RateLimitedAction?
    private var queuedIsLeading = false
    /// A burst is open: its quiet period has not passed.
    private(set) var inBurst = false
    /// The quiet period passed (or flush was called) while an action was in flight.
    private(set) var isDue = false
    var gate = InvocationGate()

    init(leading: Bool = false) {
        self.leading = leading
    }

    /// Whether an action waits to run.
    var hasPending: Bool { pending != nil }

    mutating func call(_ action: RateLimitedAction, deadline: Int64) -> MachineEffects {
        var effects = MachineEffects(timer: .arm(deadline))
        if leading && !inBurst && gate.isIdle {
            inBurst = true
            let tag = gate.deliver()
            queuedAction = action
            queuedIsLeading = true
            effects.deliver = tag
            return effects
        }
        inBurst = true
        if gate.queued != nil && !queuedIsLeading {
            // A trailing run that has not begun: the quiet period starts again.
            gate.revoke()
            effects.released = queuedAction?.run
            queuedAction = nil
        } else if let replaced = pending {
            effects.released = replaced.run
        }
        isDue = false
        pending = action
        return effects
    }

    /// The quiet period passed.
    mutating func deadlinePassed() -> MachineEffects {
        inBurst = false
        return deliverOrMarkDue()
    }

    /// `flush()`: the pending action runs now.
    mutating func flush() -> MachineEffects {
        guard pending != nil else { return MachineEffects() }
        inBurst = false
        var effects = deliverOrMarkDue()
        effects.timer = .disarm
        return effects
    }

    mutating func begin(tag: UInt64, thread: UInt) -> RateLimitedAction? {
        guard gate.begin(tag: tag, thread: thread) else { return nil }
        defer { queuedAction = nil }
        return queuedAction
    }

    mutating func end() -> MachineEffects {
        let wake = gate.end()
        var effects = isDue ? deliverOrMarkDue() : MachineEffects()
        effects.wake = wake
        return effects
    }

    mutating func cancel(thread: UInt) -> MachineEffects {
        gate.revoke()
        isDue = false
        inBurst = false
        var effects = MachineEffects(timer: .disarm, waitFor: gate.waitTicket(thread: thread))
        effects.prevented = pending != nil || queuedAction != nil
        let dropped = (pending?.run, queuedAction?.run)
        pending = nil
        queuedAction = nil
        if dropped.0 != nil || dropped.1 != nil {
            effects.released = { _ = dropped }
        }
        return effects
    }

    /// Hands the pending action over if nothing is in flight; otherwise marks it
    /// due, for the end of the running action.
    private mutating func deliverOrMarkDue() -> MachineEffects {
        guard let action = pending else {
            isDue = false
            return MachineEffects()
        }
        guard let tag = gate.deliver() else {
            isDue = true
            return MachineEffects()
        }
        isDue = false
        pending = nil
        queuedAction = action
        queuedIsLeading = false
        return MachineEffects(deliver: tag, deliverOnMainActor: action.onMainActor)
    }
}
