/// The pure state machine of a ``DelayedWork``: no lock, no clock, no engine.
///
/// | state | input | next state | effects |
/// |---|---|---|---|
/// | (made) | schedule | pending | arm the deadline |
/// | pending | deadline passed | pending | deliver (the gate admits one invocation) |
/// | pending | begin (the delivered tag) | running | the work is taken out to run |
/// | running | end | completed | wake a waiting cancel |
/// | pending | cancel | cancelled | disarm; release the work; revoke a queued delivery; preventedRun |
/// | running | cancel (another thread) | running | wait for the end (a cancel without waiting: none) |
/// | pending | reschedule | pending | revoke a queued delivery; arm the new deadline; movedDeadline |
///
/// Other inputs are no-ops.
struct DelayedWorkStateMachine: GatedStateMachine, Sendable {
    // Declared in this order so that `state` fills the gate's last byte of
    // alignment padding: every pending `DelayedWork` carries one of these.
    private var work: (@Sendable () -> Void)?
    var gate = InvocationGate()
    private(set) var state = DelayedWork.State.pending

    /// A pending machine whose work ``schedule(_:at:)`` gives it before anything
    /// else reaches it.
    init() {}

    /// Gives a machine made with ``init()`` its work, due at `deadline`.
    @inline(__always)
    mutating func schedule(_ work: @escaping @Sendable () -> Void, at deadline: Int64) -> MachineEffects {
        self.work = work
        return MachineEffects(timer: .arm(deadline))
    }

    /// Whether the work is still held (for leak tests).
    var holdsWork: Bool { work != nil }

    /// The armed deadline passed.
    mutating func deadlinePassed() -> MachineEffects {
        guard state == .pending else { return MachineEffects() }
        return MachineEffects(deliver: gate.deliver())
    }

    /// The executor reached `tag` on `thread`: the work to run, if it may.
    mutating func begin(tag: UInt64, thread: UInt) -> (@Sendable () -> Void)? {
        guard state == .pending, gate.begin(tag: tag, thread: thread) else { return nil }
        state = .running
        return work.take()
    }

    /// The work returned.
    mutating func end() -> MachineEffects {
        state = .completed
        return MachineEffects(wake: gate.end())
    }

    /// `cancel()` on `thread` (evaluated only when the work is running, which
    /// spares the common cancel of a pending work a thread-local read).
    mutating func cancel(thread: @autoclosure () -> UInt, waiting: Bool = true) -> MachineEffects {
        switch state {
        case .pending:
            state = .cancelled
            gate.revoke()
            return MachineEffects(timer: .disarm, released: work.take(), preventedRun: true)
        case .running:
            return MachineEffects(waitFor: waiting ? gate.waitTicket(thread: thread()) : nil)
        case .completed, .cancelled:
            return MachineEffects()
        }
    }

    /// What a cancel that does not wait does in the current state (see
    /// ``DelayedWork/cancelWithoutWaiting()``).
    var cancelOutcome: DelayedWork.CancelOutcome {
        switch state {
        case .pending: .prevented
        case .running: .running
        case .completed: .completed
        case .cancelled: .alreadyCancelled
        }
    }

    /// `reschedule(…)`: a pending work waits for `deadline` instead (a delivery
    /// already queued is revoked). Returns effects with `movedDeadline` set when
    /// it was pending.
    mutating func reschedule(to deadline: Int64) -> MachineEffects {
        guard state == .pending else { return MachineEffects() }
        gate.revoke()
        return MachineEffects(timer: .arm(deadline), movedDeadline: true)
    }
}
