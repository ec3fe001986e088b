import Dispatch
import Synchronization

/// The storage of a ``RepeatingTimer``: it holds the lock, performs the actions of
/// the pure ``RepeatingTimerStateMachine`` (arming under the lock, user code and
/// continuations after releasing it) and is what the engine keeps. The public
/// object can be released (which cancels) while the engine still holds this.
final class RepeatingTimerCore: TimerEntry {
    /// The handler as the core sees it: returns `false` to stop the timer (the
    /// owner-bound form returns `false` once its owner is gone).
    typealias Handler = @Sendable () -> Bool

    private struct Storage: InvocationBarrierHolder {
        var machine: RepeatingTimerStateMachine
        var armedSequence: UInt64 = 0
        var barrier = InvocationBarrier()
        var streams: [Int: AsyncStream<RepeatingTimer.Tick>.Continuation] = [:]
        var nextStreamID = 0
    }

    /// What to do once the lock is released.
    private struct Followup {
        var deliverTag: UInt64?
        var endedStreams: [AsyncStream<RepeatingTimer.Tick>.Continuation] = []
    }

    let interval: Duration
    let leewayTicks: Int64
    private let storage: StateLock<Storage>
    private let index = Atomic<Int>(-1)
    private let executor: HandlerExecutor
    /// The scheduler's engine (the scheduler itself is not needed once armed).
    private let engine: TimerEngine
    private let handler: Handler

    init(
        configuration: RepeatingTimerStateMachine.Configuration,
        leeway: Duration,
        executor: HandlerExecutor,
        scheduler: any TimerScheduler,
        handler: @escaping Handler
    ) {
        self.interval = .nanoseconds(configuration.interval)
        self.leewayTicks = DeadlineArithmetic.delayNanoseconds(leeway)
        self.executor = executor
        self.engine = scheduler.engine
        self.handler = handler
        self.storage = StateLock(Storage(machine: RepeatingTimerStateMachine(configuration: configuration)))
    }

    var timerSlot: Int {
        get { index.load(ordering: .relaxed) }
        set { index.store(newValue, ordering: .relaxed) }
    }

    var state: TimerState { storage.withLock { $0.machine.state } }
    var fireCount: Int { storage.withLock { $0.machine.fireCount } }

    func start() { transition { $0.start(now: $1) } }
    func suspend() { transition { machine, _ in machine.suspend() } }
    func resume() { transition { $0.resume(now: $1) } }

    /// Cancels, then waits for a handler running on another thread to return.
    func cancel() { transition(waitingForRunningHandler: true) { machine, _ in machine.cancel() } }

    private func transition(
        waitingForRunningHandler: Bool = false,
        _ input: (inout RepeatingTimerStateMachine, Int64) -> RepeatingTimerStateMachine.Action
    ) {
        let now = engine.nowTicks
        let (followup, waitFor) = storage.withLock { storage -> (Followup, UInt64?) in
            let action = input(&storage.machine, now)
            let followup = apply(action, to: &storage, engine: engine)
            return (followup, waitingForRunningHandler ? storage.barrier.registerWaiter() : nil)
        }
        perform(followup, engine: engine)
        if let waitFor { storage.waitForInvocation(waitFor) }
    }

    /// Performs the engine part of `action` (lock held: arming order then matches
    /// the order of state changes) and returns the rest for after the lock.
    private func apply(
        _ action: RepeatingTimerStateMachine.Action, to storage: inout Storage, engine: TimerEngine
    ) -> Followup {
        switch action.timer {
        case .none:
            break
        case .arm(let deadline):
            storage.armedSequence = engine.arm(self, at: deadline)
        case .disarm:
            storage.armedSequence = 0
            engine.disarm(self)
        }
        var followup = Followup()
        if action.deliver { followup.deliverTag = storage.machine.generation }
        if action.stopped {
            followup.endedStreams = Array(storage.streams.values)
            storage.streams.removeAll()
        }
        return followup
    }

    private func perform(_ followup: Followup, engine: TimerEngine) {
        for stream in followup.endedStreams { stream.finish() }
        if let tag = followup.deliverTag {
            executor.deliver(engine: engine) { self.invoke(tag: tag) }
        }
    }

    func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        let now = engine.nowTicks
        let followup = storage.withLock { storage -> Followup? in
            guard storage.armedSequence == sequence else { return nil }
            storage.armedSequence = 0
            let action = storage.machine.tick(deadline: deadline, now: now)
            return apply(action, to: &storage, engine: engine)
        }
        if let followup { perform(followup, engine: engine) }
    }

    private func invoke(tag: UInt64) {
        let now = engine.nowTicks
        let begun = storage.withLock {
            storage -> (RepeatingTimer.Tick, [AsyncStream<RepeatingTimer.Tick>.Continuation])? in
            guard storage.machine.beginInvocation(tag: tag) else { return nil }
            storage.barrier.begin()
            let tick = RepeatingTimer.Tick(number: storage.machine.fireCount, time: .nanoseconds(now))
            return (tick, Array(storage.streams.values))
        }
        guard let (tick, streams) = begun else { return }
        for stream in streams { stream.yield(tick) }
        let keepGoing = handler()
        let (followup, wake) = storage.withLock { storage -> (Followup, Bool) in
            let wake = storage.barrier.end()
            let action = keepGoing ? storage.machine.endInvocation(tag: tag) : storage.machine.cancel()
            return (apply(action, to: &storage, engine: engine), wake)
        }
        if wake { InvocationParking.wakeAll() }
        perform(followup, engine: engine)
    }

    /// A new stream of ticks; it ends when the timer is cancelled or finishes.
    func makeTickStream() -> AsyncStream<RepeatingTimer.Tick> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: RepeatingTimer.Tick.self, bufferingPolicy: .bufferingNewest(RepeatingTimer.tickBufferSize))
        let id = storage.withLock { storage in
            defer { storage.nextStreamID += 1 }
            return storage.nextStreamID
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.storage.withLock { $0.streams.removeValue(forKey: id) }
        }
        let open = storage.withLock { storage -> Bool in
            switch storage.machine.state {
            case .cancelled, .finished:
                return false
            case .idle, .running, .suspended:
                storage.streams[id] = continuation
                return true
            }
        }
        if !open { continuation.finish() }
        return stream
    }
}
