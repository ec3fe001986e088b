/// An action handed to a ``Debouncer`` or a ``Throttler``, and where it runs.
struct RateLimitedAction: Sendable {
    let run: @Sendable () -> Void
    /// Run on the main actor instead of the primitive's queue.
    let onMainActor: Bool
}

/// The pure state machine of a ``Debouncer``: no lock, no clock, no engine.
///
/// A *burst* is a run of calls, each less than `delay` after the previous; it
/// ends (its *quiet period* is over) `delay` after its last call. A run handed to
/// the executor is either *trailing* (the end of a quiet period: a later call
/// calls it off and starts the quiet period again) or *fixed* (a leading run, or
/// a flushed one: nothing calls it off but `cancel()`).
///
/// | input | effects |
/// |---|---|
/// | call, leading and no burst open | a trailing run that has not begun (queued, or due while one ran) is revoked and released; the action is queued to run now, or right after the running one (fixed); the burst opens |
/// | call otherwise | the action replaces the pending one (released); a queued trailing run that has not begun is revoked; arm now + delay |
/// | deadline passed (quiet period over) | the burst closes; deliver the pending action (trailing), or run it right after the running one ends |
/// | flush | disarm, close the burst (also with nothing pending); the pending action runs now (fixed), or right after the running one |
/// | begin (the delivered tag) | the queued action is taken out to run |
/// | end | deliver a flushed action, else the pending one if its quiet period passed meanwhile |
/// | cancel | release every action held, revoke, disarm; wait for a running action on another thread |
///
/// So the actions never overlap, one trailing run follows each quiet period
/// unless a later call came before it could begin (the last run is always the
/// latest call), a
/// flushed action always runs (in the order flushed), and with `leading` the first call of a burst
/// runs at once (a burst of one call runs once, not twice).
struct DebouncerStateMachine: GatedStateMachine, Sendable {
    let leading: Bool
    /// The latest call's action, until its quiet period passes.
    private var pending: RateLimitedAction?
    /// Flushed actions waiting for the running one to end, oldest first (each
    /// `flush()` promises its action runs).
    private var flushed: [RateLimitedAction] = []
    /// The action the queued delivery runs, and whether a call may revoke it.
    private var queuedAction: RateLimitedAction?
    private var queuedIsFixed = false
    /// A burst is open: its quiet period has not passed.
    private(set) var inBurst = false
    /// The quiet period passed while an action was in flight.
    private(set) var isDue = false
    var gate = InvocationGate()

    init(leading: Bool = false) {
        self.leading = leading
    }

    /// Whether an action waits to run.
    var hasPending: Bool { pending != nil || !flushed.isEmpty }

    mutating func call(_ action: RateLimitedAction, deadline: Int64) -> MachineEffects {
        var effects = MachineEffects(timer: .arm(deadline))
        if leading && !inBurst {
            inBurst = true
            // The last burst's trailing run, if it has not begun (queued, or
            // owed since its quiet period passed while an action ran): this
            // later call supersedes it, as any call supersedes a run that has
            // not begun, so the last run is always the latest call.
            if gate.queued != nil && !queuedIsFixed {
                gate.revoke()
                effects.released = queuedAction?.run
                queuedAction = nil
            } else if isDue, let due = pending {
                effects.released = due.run
                pending = nil
                isDue = false
            }
            if gate.isIdle {
                deliver(action, fixed: true, &effects)
            } else {
                flushed.append(action)  // right after the running action
            }
            return effects
        }
        inBurst = true
        if gate.queued != nil && !queuedIsFixed {
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
        var effects = MachineEffects()
        guard let action = pending else { return effects }
        if gate.isIdle {
            pending = nil
            deliver(action, fixed: false, &effects)
        } else {
            isDue = true
        }
        return effects
    }

    /// `flush()`: the pending action runs now (or right after the running one),
    /// and no later call can call it off.
    mutating func flush() -> MachineEffects {
        var effects = MachineEffects(timer: .disarm)
        inBurst = false
        isDue = false
        guard let action = pending else { return effects }
        pending = nil
        if gate.isIdle {
            deliver(action, fixed: true, &effects)
        } else {
            flushed.append(action)
        }
        return effects
    }

    mutating func begin(tag: UInt64, thread: UInt) -> RateLimitedAction? {
        guard gate.begin(tag: tag, thread: thread) else { return nil }
        return queuedAction.take()
    }

    mutating func end() -> MachineEffects {
        var effects = MachineEffects(wake: gate.end())
        if !flushed.isEmpty {
            deliver(flushed.removeFirst(), fixed: true, &effects)
        } else if isDue, let action = pending {
            isDue = false
            pending = nil
            deliver(action, fixed: false, &effects)
        }
        return effects
    }

    mutating func cancel(thread: UInt) -> MachineEffects {
        gate.revoke()
        isDue = false
        inBurst = false
        var effects = MachineEffects(timer: .disarm, waitFor: gate.waitTicket(thread: thread))
        let dropped = (pending?.run, flushed.map(\.run), queuedAction?.run)
        effects.preventedRun = dropped.0 != nil || !dropped.1.isEmpty || dropped.2 != nil
        pending = nil
        flushed = []
        queuedAction = nil
        if effects.preventedRun { effects.released = { _ = dropped } }
        return effects
    }

    /// Queues `action` to run (nothing in flight).
    private mutating func deliver(_ action: RateLimitedAction, fixed: Bool, _ effects: inout MachineEffects) {
        guard let tag = gate.deliver() else { return }
        queuedAction = action
        queuedIsFixed = fixed
        effects.deliver = tag
        effects.deliverOnMainActor = action.onMainActor
    }
}
