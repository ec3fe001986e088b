import Dispatch
import Synchronization

/// The storage of a ``RepeatingTimer``: it holds the lock, performs the effects of
/// the pure ``RepeatingTimerStateMachine`` (arming under the lock, user code and
/// continuations after releasing it) and is what the engine keeps. The public
/// object can be released (which cancels) while the engine still holds this.
/// `@unchecked Sendable` invariant (the base class ``TimerEntry`` makes the
/// compiler leave it to us): every stored property is a `let` of a `Sendable`
/// type (the lock that guards the machine, atomics, the executor, the engine).
final class RepeatingTimerCore: TimerEntry, GatedPrimitive, @unchecked Sendable {
    /// The user's handler, as the core calls it.
    enum Handler: Sendable {
        /// A plain handler.
        case plain(@Sendable () -> Void)
        /// An owner-bound handler: `load` returns the owner (strongly) or nil once
        /// it is gone; `run` is called with it.
        case owned(load: @Sendable () -> AnyObject?, run: @Sendable (AnyObject) -> Void)
    }

    typealias Continuation = AsyncStream<RepeatingTimer.Tick>.Continuation

    let interval: Duration
    /// How late a firing may come (see ``TimerEntry/leewayTicks``).
    private let leeway: Int64

    override var leewayTicks: Int64 { leeway }
    let storage: StateLock<LockedMachine<RepeatingTimerStateMachine>>
    /// Tick streams by id. A stream registers first and checks the state after,
    /// and a stop takes the streams after changing the state, so none is missed.
    private let streams = StateLock<[Int: Continuation]>([:])
    private let nextStreamID = Atomic<Int>(0)
    let executor: HandlerExecutor
    /// The scheduler's engine: kept, so releasing the scheduler never stops the timer.
    let engine: TimerEngine
    /// Kept until the timer is released (``release()``): `start()` may run it
    /// again after a cancel. A delivery still waiting in a queue then finds
    /// nothing, so it does not keep the captures alive.
    private let handler: StateLock<Handler?>

    init(
        configuration: RepeatingTimerStateMachine.Configuration,
        leeway: Duration,
        executor: HandlerExecutor,
        scheduler: (any TimerScheduler)?,
        handler: Handler
    ) {
        self.interval = .nanoseconds(configuration.interval)
        // As GCD does: a leeway never exceeds half the interval, or a timer could
        // skip ticks (or, with a huge leeway, never tick at all).
        self.leeway = min(DeadlineArithmetic.delayNanoseconds(leeway), configuration.interval / 2)
        self.executor = executor
        self.engine = TimerEngine.of(scheduler)
        self.handler = StateLock(handler)
        self.storage = StateLock(LockedMachine(machine: RepeatingTimerStateMachine(configuration: configuration)))
    }

    var state: TimerState { storage.withLock { $0.machine.state } }
    var fireCount: Int { storage.withLock { $0.machine.fireCount } }

    func start(after delay: Duration? = nil) {
        let now = engine.nowTicks
        let first = delay.map { DeadlineArithmetic.deadline(now: now, after: $0) }
        perform(transition { $0.start(now: now, firstDeadline: first) })
    }

    func suspend() { perform(transition { $0.suspend() }) }

    func resume() {
        let now = engine.nowTicks
        perform(transition { $0.resume(now: now) })
    }

    /// Cancels, then waits for a handler running on another thread to return.
    func cancel(thread: UInt = ThreadIdentity.current()) {
        perform(transition { $0.cancel(thread: thread) })
    }

    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        let now = engine.nowTicks
        if let effects = effectsOfFiring(sequence: sequence, { $0.tick(deadline: deadline, now: now) }) {
            perform(effects)
        }
    }

    /// Completes `effects` and ends the tick streams when the timer stopped.
    private func perform(_ effects: consuming MachineEffects) {
        let stopped = effects.stopped
        complete(effects)
        if stopped { endStreams() }
    }

    /// The first half of an invocation (tests drive it directly): the tick, if
    /// `tag` may begin on `thread`.
    func begin(tag: UInt64, thread: UInt, ownerAlive: Bool = true) -> RepeatingTimer.Tick? {
        let now = engine.nowTicks
        var number: Int? = nil
        let effects = transition { machine in
            let begun = machine.begin(tag: tag, thread: thread, ownerAlive: ownerAlive)
            number = begun.number
            return begun.effects
        }
        perform(effects)
        guard let number else { return nil }
        let tick = RepeatingTimer.Tick(number: number, time: .nanoseconds(now))
        for stream in streams.withLock({ Array($0.values) }) { stream.yield(tick) }
        return tick
    }

    /// The second half of an invocation.
    func end() {
        perform(transition { $0.end() })
    }

    /// The public timer was released: cancel (waiting for a running handler on
    /// another thread) and drop the handler and its captures.
    func release() {
        cancel()
        let dropped = handler.withLock { $0.take() }
        _ = dropped  // released here, outside the lock
    }

    func invoke(tag: UInt64) {
        let thread = ThreadIdentity.current()
        guard let handler = handler.withLock({ $0 }) else { return }
        switch handler {
        case .plain(let run):
            guard begin(tag: tag, thread: thread) != nil else { return }
            run()
        case .owned(let load, let run):
            // The owner is loaded (strongly) before the invocation counts, and
            // released only after it ended, outside every lock: its deinit may
            // release the timer.
            var owner = load()
            guard begin(tag: tag, thread: thread, ownerAlive: owner != nil) != nil, let alive = owner else { return }
            run(alive)
            end()
            owner = nil
            return
        }
        end()
    }

    /// A new stream of ticks; it ends when the timer is cancelled or finishes.
    func makeTickStream() -> AsyncStream<RepeatingTimer.Tick> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: RepeatingTimer.Tick.self, bufferingPolicy: .bufferingNewest(RepeatingTimer.tickBufferSize))
        let id = nextStreamID.add(1, ordering: .relaxed).newValue
        continuation.onTermination = { [weak self] _ in
            _ = self?.streams.withLock { $0.removeValue(forKey: id) }
        }
        streams.withLock { $0[id] = continuation }
        switch state {
        case .cancelled, .finished:
            if let removed = streams.withLock({ $0.removeValue(forKey: id) }) { removed.finish() }
        case .idle, .running, .suspended:
            break
        }
        return stream
    }

    private func endStreams() {
        let ended = streams.withLock { streams in
            let ended = Array(streams.values)
            streams.removeAll()
            return ended
        }
        for stream in ended { stream.finish() }
    }
}
