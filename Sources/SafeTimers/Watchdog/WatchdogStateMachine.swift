/// The pure state machine of a ``Watchdog``: no lock, no clock, no engine.
///
/// The engine entry is moved lazily: ``kick(now:timeout:)`` only records the
/// new deadline (unless it is earlier than the armed one), and when the armed
/// deadline passes the entry is re-armed at the recorded one.
///
/// | status | input | next | effects |
/// |---|---|---|---|
/// | armed | kick, now before the deadline | armed | deadline = now + timeout; arm only if that is earlier than the armed deadline |
/// | armed | kick, now at or after the deadline | armed | refused (the overrun stands, even if the engine has not reached it yet) |
/// | armed | deadline passed, kicked since | armed | arm the recorded deadline |
/// | armed | deadline passed | armed | deliver (the gate admits one invocation; kicks no longer count) |
/// | armed | begin (the delivered tag) | fired | the handler is taken out to run |
/// | fired | end | fired | wake a waiting invalidate |
/// | armed | invalidate | invalidated | disarm; release the handler; revoke a queued delivery |
/// | fired | invalidate (handler running on another thread) | fired | wait for the end |
///
/// Other inputs are no-ops. So the handler runs at most once, and never after
/// `invalidate()` returned.
struct WatchdogStateMachine: GatedStateMachine, Sendable {
    enum Status: Sendable { case armed, fired, invalidated }

    private(set) var status = Status.armed
    /// The timeout in effect, as given, and in ticks (never negative).
    private(set) var timeoutDuration: Duration
    private(set) var timeout: Int64
    /// The deadline the watchdog wants.
    private(set) var deadline: Int64
    /// The deadline the engine entry is armed at (at most `deadline`, unless a
    /// shorter timeout moved `deadline` earlier, which re-arms at once).
    private var armedAt: Int64
    private var handler: (@Sendable () -> Void)?
    var gate = InvocationGate()

    /// A watchdog of `timeout` that ``arm(now:handler:)`` starts before anything
    /// else reaches it.
    init(timeout: Duration) {
        self.timeoutDuration = timeout
        self.timeout = DeadlineArithmetic.delayNanoseconds(timeout)
        self.deadline = DeadlineArithmetic.never
        self.armedAt = DeadlineArithmetic.never
    }

    /// The first arming: the deadline is `now` + the timeout, and `handler` runs
    /// if it passes. (Given under the lock rather than to ``init(timeout:)``:
    /// building the machine with the closure in it copied it into the lock.)
    mutating func arm(now: Int64, handler: @escaping @Sendable () -> Void) -> MachineEffects {
        deadline = DeadlineArithmetic.adding(timeout, to: now)
        armedAt = deadline
        self.handler = handler
        return MachineEffects(timer: .arm(armedAt))
    }

    /// Whether the handler is still held (for leak tests).
    var holdsHandler: Bool { handler != nil }

    /// `kick()` or `kick(timeout:)` at `now`.
    /// `movedDeadline` in the effects tells whether the kick took effect. A kick at
    /// or after the deadline is refused whether or not the engine has delivered
    /// it yet (a busy scheduler thread may be behind the clock).
    mutating func kick(now: Int64, timeout newTimeout: Duration? = nil) -> MachineEffects {
        guard status == .armed, gate.isIdle, now < deadline else { return MachineEffects() }
        if let newTimeout {
            timeoutDuration = newTimeout
            timeout = DeadlineArithmetic.delayNanoseconds(newTimeout)
        }
        deadline = DeadlineArithmetic.adding(timeout, to: now)
        guard deadline < armedAt else { return MachineEffects(movedDeadline: true) }
        armedAt = deadline
        return MachineEffects(timer: .arm(deadline), movedDeadline: true)
    }

    /// The armed deadline `passed` was reached.
    mutating func deadlinePassed(_ passed: Int64) -> MachineEffects {
        guard status == .armed else { return MachineEffects() }
        if deadline > passed {
            armedAt = deadline
            return MachineEffects(timer: .arm(deadline))
        }
        return MachineEffects(deliver: gate.deliver())
    }

    /// The executor reached `tag` on `thread`: the handler to run, if it may.
    mutating func begin(tag: UInt64, thread: UInt) -> (@Sendable () -> Void)? {
        guard status == .armed, gate.begin(tag: tag, thread: thread) else { return nil }
        status = .fired
        return handler.take()
    }

    /// The handler returned.
    mutating func end() -> MachineEffects {
        MachineEffects(wake: gate.end())
    }

    /// Whether nothing can happen any more: invalidated before it fired, or
    /// fired and the handler has returned (an `invalidate()` that finds this has
    /// nothing to do or wait for, now or later).
    var isSettled: Bool {
        status == .invalidated || (status == .fired && gate.isIdle)
    }

    /// `invalidate()` on `thread` (evaluated only when the handler has begun).
    mutating func invalidate(thread: @autoclosure () -> UInt) -> MachineEffects {
        switch status {
        case .armed:
            status = .invalidated
            gate.revoke()
            return MachineEffects(timer: .disarm, released: handler.take(), preventedRun: true)
        case .fired:
            return MachineEffects(waitFor: gate.waitTicket(thread: thread()))
        case .invalidated:
            return MachineEffects()
        }
    }
}
