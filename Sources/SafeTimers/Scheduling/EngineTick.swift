/// A repeating engine entry whose body runs on the thread that fires it: the
/// scheduler thread of a ``SystemTimerScheduler``, the thread calling `advance`
/// of a manual one. It fires on the grid `start + k × period`; points missed
/// while the thread was late are skipped.
///
/// For StallDetection's shared heartbeat, which posts every detector's probe
/// from one firing: the body must only take short locks and enqueue work. It
/// never runs user code (the scheduler thread runs no handler), and while it
/// runs every other timer of the scheduler waits.
///
/// `@unchecked Sendable` invariant (the base class ``TimerEntry`` makes the
/// compiler leave it to us): every stored property is a `let` of a `Sendable`
/// type; the mutable state is inside the `StateLock`.
package final class EngineTick: TimerEntry, @unchecked Sendable {
    private struct State {
        /// The sequence of the current arming; a firing of another is stale.
        var sequence: UInt64 = 0
        var started = false
        var cancelled = false
    }

    private let state = StateLock(State())
    private let engine: TimerEngine
    private let period: Int64
    private let body: @Sendable () -> Void

    /// A tick every `period` (at least a microsecond) on `scheduler`, calling
    /// `body` from the first tick after ``start()`` until ``cancel()``.
    package init(period: Duration, scheduler: any TimerScheduler, body: @escaping @Sendable () -> Void) {
        self.engine = scheduler.engine
        self.period = max(1_000, DeadlineArithmetic.delayNanoseconds(period))
        self.body = body
    }

    /// Arms the first tick a period from now. Only the first call does anything,
    /// and none after ``cancel()``.
    package func start() {
        state.withLock { state in
            guard !state.started, !state.cancelled else { return }
            state.started = true
            state.sequence = engine.arm(self, at: DeadlineArithmetic.adding(period, to: engine.nowTicks))
        }
    }

    /// Stops the ticks. A body already running finishes; none starts after this
    /// returns.
    package func cancel() {
        state.withLock { state in
            state.cancelled = true
            _ = engine.disarm(self)
        }
    }

    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        let current = state.withLock { state -> Bool in
            guard !state.cancelled, state.sequence == sequence else { return false }
            let late = max(0, engine.nowTicks - deadline)
            let next = DeadlineArithmetic.adding(
                DeadlineArithmetic.multiplying(period, by: late / period + 1), to: deadline)
            state.sequence = engine.arm(self, at: next)
            return true
        }
        if current { body() }
    }
}
