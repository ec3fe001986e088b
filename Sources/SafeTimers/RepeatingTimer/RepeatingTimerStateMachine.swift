/// The pure state machine of a ``RepeatingTimer``: no locks, no clock, no engine.
/// Each input returns the ``MachineEffects`` its storage must perform.
///
/// Three numbers say everything about a run (the time since the last `start()`):
/// - ``fireCount``: invocations that began;
/// - ``owed``: invocations earned by ticks under the ``MissedTickPolicy`` and not
///   yet handed to the executor;
/// - the gate's queued invocation (0 or 1), handed to the executor, not begun.
///
/// With `repetitions`, ``remaining`` = repetitions − fireCount − queued − owed is
/// never negative, and the timer is ``TimerState/finished`` exactly when it
/// reaches 0 with nothing in flight. Every input ends in ``settle(_:)``, the one
/// place that delivers, arms, disarms and finishes, so those rules hold after
/// every input.
///
/// | state | input | next state | what happens |
/// |---|---|---|---|
/// | idle, cancelled, finished | start | running (finished if repetitions ≤ 0) | counters reset; one invocation owed if `firesImmediately` |
/// | running | suspend | suspended | owed invocations dropped; a queued one revoked; disarm |
/// | suspended | resume | running | next tick one interval from now |
/// | any but cancelled | cancel | cancelled | owed dropped, queued revoked, disarm; waits for a running handler on another thread |
/// | running | tick | running | next grid point; owe per ``MissedTickPolicy`` |
/// | running | begin (owner gone) | cancelled | as cancel; the invocation does not count |
/// | any | end | same | settle |
///
/// A *running* handler is never forgotten: suspend, resume, cancel and a
/// restart leave the gate's record of it alone, so no second invocation can be
/// queued until it has ended (see ``InvocationGate``).
struct RepeatingTimerStateMachine: GatedStateMachine, Sendable {
    struct Configuration: Sendable, Hashable {
        /// Nanoseconds, at least ``RepeatingTimer/minimumInterval``.
        var interval: Int64
        /// `nil` for forever; never negative.
        var repetitions: Int?
        var firesImmediately: Bool
        var missedTicks: MissedTickPolicy
    }

    let configuration: Configuration
    private(set) var state = TimerState.idle
    /// Invocations begun since the last start.
    private(set) var fireCount = 0
    /// Invocations earned and not yet handed to the executor.
    private(set) var owed = 0
    /// The grid point the timer is (or is about to be) armed for.
    private(set) var nextDeadline: Int64 = 0
    /// Whether the engine entry is armed for ``nextDeadline``.
    private(set) var isArmed = false
    var gate = InvocationGate()

    init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// Invocations this run may still earn; nil for a timer without repetitions.
    var remaining: Int? {
        configuration.repetitions.map { $0 - fireCount - owed - (gate.queued == nil ? 0 : 1) }
    }

    /// `start()` at `now`; with `firstDeadline`, `start(after:)`: the first tick
    /// comes then (not immediately, not one interval later) and the grid
    /// continues from it.
    mutating func start(now: Int64, firstDeadline: Int64? = nil) -> MachineEffects {
        switch state {
        case .running, .suspended:
            return MachineEffects()
        case .idle, .cancelled, .finished:
            break
        }
        state = .running
        fireCount = 0
        owed = configuration.firesImmediately && firstDeadline == nil ? 1 : 0
        nextDeadline = firstDeadline ?? DeadlineArithmetic.adding(configuration.interval, to: now)
        var effects = MachineEffects()
        if let repetitions = configuration.repetitions {
            owed = min(owed, repetitions)
        }
        settle(&effects)
        return effects
    }

    mutating func suspend() -> MachineEffects {
        guard state == .running else { return MachineEffects() }
        state = .suspended
        var effects = MachineEffects()
        stopTicking(&effects)
        return effects
    }

    mutating func resume(now: Int64) -> MachineEffects {
        guard state == .suspended else { return MachineEffects() }
        state = .running
        nextDeadline = DeadlineArithmetic.adding(configuration.interval, to: now)
        var effects = MachineEffects()
        settle(&effects)
        return effects
    }

    /// `cancel()` on `thread` (also what a release does).
    mutating func cancel(thread: UInt) -> MachineEffects {
        var effects = MachineEffects()
        if state != .cancelled {
            state = .cancelled
            stopTicking(&effects)
            effects.stopped = true
        }
        effects.waitFor = gate.waitTicket(thread: thread)
        return effects
    }

    /// The deadline `deadline` passed; it is `now`.
    mutating func tick(deadline: Int64, now: Int64) -> MachineEffects {
        guard state == .running, isArmed else { return MachineEffects() }
        isArmed = false
        let interval = configuration.interval
        let missed = max(0, now &- deadline) / interval  // whole intervals late
        nextDeadline = DeadlineArithmetic.adding(DeadlineArithmetic.multiplying(interval, by: missed + 1), to: deadline)
        let due = Int(clamping: missed) &+ 1
        switch configuration.missedTicks {
        case .skip:
            if gate.isIdle && owed == 0 { owed = 1 }
        case .coalesce:
            owed = max(owed, 1)
        case .catchUp(let limit):
            let (sum, overflow) = owed.addingReportingOverflow(due)
            owed = min(overflow ? Int.max : sum, max(limit, 1))
        }
        if let repetitions = configuration.repetitions {
            owed = min(owed, max(0, repetitions - fireCount - (gate.queued == nil ? 0 : 1)))
        }
        var effects = MachineEffects()
        settle(&effects)
        return effects
    }

    /// The executor reached `tag` on `thread`. `ownerAlive` is false when the
    /// owner of an owner-bound timer is gone: the timer cancels itself and the
    /// invocation does not count. Returns the tick number if the handler may run.
    mutating func begin(tag: UInt64, thread: UInt, ownerAlive: Bool = true) -> (number: Int?, effects: MachineEffects) {
        guard state == .running, gate.queued == tag else { return (nil, MachineEffects()) }
        guard ownerAlive else { return (nil, cancel(thread: thread)) }
        _ = gate.begin(tag: tag, thread: thread)
        fireCount += 1
        return (fireCount, MachineEffects())
    }

    /// The invocation that began on this timer returned.
    mutating func end() -> MachineEffects {
        var effects = MachineEffects(wake: gate.end())
        settle(&effects)
        return effects
    }

    /// Leaves the running state's bookkeeping: nothing owed, nothing queued, the
    /// entry disarmed. A running handler stays recorded in the gate.
    private mutating func stopTicking(_ effects: inout MachineEffects) {
        owed = 0
        gate.revoke()
        if isArmed {
            isArmed = false
            effects.timer = .disarm
        }
    }

    /// The one place that acts on a running timer's numbers: hands an owed
    /// invocation to the executor when nothing is in flight, finishes once every
    /// repetition has begun and ended, and keeps the entry armed exactly while
    /// more invocations can be earned.
    private mutating func settle(_ effects: inout MachineEffects) {
        guard state == .running else { return }
        if owed > 0, let tag = gate.deliver() {
            owed -= 1
            effects.deliver = tag
        }
        if remaining == 0 {
            if isArmed {
                isArmed = false
                effects.timer = .disarm
            }
            if gate.isIdle && owed == 0 {
                state = .finished
                effects.stopped = true
            }
        } else if !isArmed {
            isArmed = true
            effects.timer = .arm(nextDeadline)
        }
    }
}
