/// What a primitive's state machine asks its storage to do after an input. The
/// storage performs it: the timer command under the lock (so the engine sees
/// armings in the order of the state changes), everything else after releasing
/// it.
struct MachineEffects {
    /// What to do with the primitive's engine entry.
    var timer = TimerCommand.keep
    /// A tag the gate queued: hand it to the executor.
    var deliver: UInt64?
    /// Hand it to the main actor instead of the primitive's executor (a
    /// main-actor action given to a `Debouncer` or `Throttler`).
    var deliverOnMainActor = false
    /// A user closure the input took out of the state: released outside the lock,
    /// before the call that made the input returns.
    var released: (@Sendable () -> Void)?
    /// A ticket to wait for: the handler runs on another thread and the input was
    /// a cancel, which must not return before it ended.
    var waitFor: WaitTicket?
    /// A cancel (or `invalidate()`) prevented a run that was pending: what
    /// `cancel()` returns.
    var preventedRun = false
    /// A reschedule or a kick moved a pending deadline: what `reschedule` and
    /// `kick()` return.
    var movedDeadline = false
    /// Whether the primitive stopped for good (a timer cancelled or finished):
    /// tick streams end.
    var stopped = false
    /// Whether an invocation ended while a cancel waits for it: wake the waiters.
    var wake = false
}

/// A primitive's state machine and the engine arming it answers to, as kept
/// under the primitive's lock.
struct LockedMachine<Machine: GatedStateMachine>: GatedStateMachine {
    /// The sequence number of the engine arming that is current; 0 when disarmed.
    /// A firing of an older arming is ignored. (First, so that a machine whose
    /// size is not a multiple of 8 leaves its tail padding to what follows.)
    var armed: UInt64 = 0
    var machine: Machine

    var gate: InvocationGate {
        get { machine.gate }
        set { machine.gate = newValue }
    }
}

/// The storage side shared by every primitive: a pure state machine behind a
/// lock, an engine entry, and an executor for the handler.
///
/// The discipline, written once here:
/// 1. ``transition(_:)``: an input changes the machine under the lock; its timer
///    command is applied to the engine under the same lock.
/// 2. ``complete(_:)``: after the lock is released, a released closure is
///    dropped, a queued tag is delivered, and a cancel waits for the handler if
///    it runs on another thread.
/// User code never runs, and is never released, under the lock.
protocol GatedPrimitive: TimerEntry, InvocationTarget {
    associatedtype Machine: GatedStateMachine
    var storage: StateLock<LockedMachine<Machine>> { get }
    var engine: TimerEngine { get }
    var executor: HandlerExecutor { get }
    /// Runs `body` with the engine, without counting a reference to it where
    /// the primitive does not (see `DelayedWork.withEngine(_:)`).
    func withEngine<Result>(_ body: (TimerEngine) -> Result) -> Result
}

extension GatedPrimitive {
    /// The engine as the primitive holds it.
    @inline(__always)
    func withEngine<Result>(_ body: (TimerEngine) -> Result) -> Result { body(engine) }
}

extension GatedPrimitive {
    /// Applies `input` to the machine under the lock, performing its timer
    /// command there too; returns the rest of its effects.
    ///
    /// The closure borrows `self` through an `Unmanaged` value: a captured
    /// reference would be retained and released around the lock (two atomic
    /// writes per call).
    @inline(__always)
    func transition(_ input: (inout Machine) -> MachineEffects) -> MachineEffects {
        let primitive = Unmanaged.passUnretained(self)
        return storage.withLock { locked -> MachineEffects in
            let effects = input(&locked.machine)
            primitive._withUnsafeGuaranteedRef { $0.apply(effects.timer, to: &locked) }
            return effects
        }
    }

    /// Applies a timer command (lock held).
    @inline(__always)
    func apply(_ command: TimerCommand, to locked: inout LockedMachine<Machine>) {
        switch command {
        case .keep:
            break
        case .arm(let deadline):
            locked.armed = withEngine { $0.arm(self, at: deadline) }
        case .disarm:
            if locked.armed != 0 {
                locked.armed = 0
                withEngine { _ = $0.disarm(self) }
            }
        }
    }

    /// Performs what an input left for after the lock (see ``GatedPrimitive``).
    @inline(__always)
    func complete(_ effects: consuming MachineEffects) {
        effects.released = nil
        if effects.wake { InvocationParking.wakeAll() }
        if let tag = effects.deliver {
            let executor = effects.deliverOnMainActor && !isRecording ? HandlerExecutor.mainActor : self.executor
            withEngine { $0.deliver(self, tag: tag, to: executor) }
        }
        if let ticket = effects.waitFor { storage.wait(for: ticket) }
    }

    /// Whether the executor is a test recorder (which then also takes main-actor
    /// deliveries, so the test decides when they begin).
    private var isRecording: Bool {
        if case .recorder = executor { return true }
        return false
    }

    /// Tests: completes `effects` like ``complete(_:)`` but, instead of waiting,
    /// returns the ticket a cancel would wait for (see ``hasPassed(_:)``).
    func completeReturningTicket(_ effects: consuming MachineEffects) -> WaitTicket? {
        let ticket = effects.waitFor
        effects.waitFor = nil
        complete(effects)
        return ticket
    }

    /// Tests: whether the invocation `ticket` waits for has ended.
    func hasPassed(_ ticket: WaitTicket) -> Bool { storage.withLock { $0.gate.hasPassed(ticket) } }

    /// Tests: whether the invocation `ticket` waits for has ended; once it has,
    /// the waiter is unregistered.
    func passWaiter(_ ticket: WaitTicket) -> Bool {
        storage.withLock { locked in
            guard locked.gate.hasPassed(ticket) else { return false }
            locked.gate.leave()
            return true
        }
    }

    /// The engine fired the arming `sequence`: if it is still the current one,
    /// `input` handles the deadline (lock held), and its effects are completed.
    @inline(__always)
    func fired(sequence: UInt64, _ input: (inout Machine) -> MachineEffects) {
        if let effects = effectsOfFiring(sequence: sequence, input) { complete(effects) }
    }

    /// The lock-held half of ``fired(sequence:_:)``: nil when `sequence` is not
    /// the current arming; otherwise `input`'s effects, its timer command applied.
    @inline(__always)
    func effectsOfFiring(sequence: UInt64, _ input: (inout Machine) -> MachineEffects) -> MachineEffects? {
        let primitive = Unmanaged.passUnretained(self)
        return storage.withLock { locked -> MachineEffects? in
            guard locked.armed == sequence else { return nil }
            locked.armed = 0
            let effects = input(&locked.machine)
            primitive._withUnsafeGuaranteedRef { $0.apply(effects.timer, to: &locked) }
            return effects
        }
    }
}

/// A primitive whose invocation runs one closure: `DelayedWork`, `Watchdog`,
/// `Debouncer` and `Throttler` (a repeating timer's handler may need its owner
/// loaded first; `RepeatingTimerCore` keeps its own `invoke(tag:)`).
protocol ClosureInvoking: GatedPrimitive {
    /// The first half of an invocation: what to run, if the gate admits `tag`
    /// on `thread` (the machine is then running it).
    func begin(tag: UInt64, thread: UInt) -> (@Sendable () -> Void)?
    /// The second half: the machine settles (waiters wake, owed runs are
    /// delivered).
    func end()
}

extension ClosureInvoking {
    /// The invocation path: begin, run with no lock held, drop the closure (its
    /// captures are released before the run counts as ended, so a cancel that
    /// waited for it finds them gone), end.
    func invoke(tag: UInt64) {
        guard var body = begin(tag: tag, thread: ThreadIdentity.current()) else { return }
        body()
        body = {}
        end()
    }
}
