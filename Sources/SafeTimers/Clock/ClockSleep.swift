import Synchronization

/// One task suspended in ``TimerClock/sleep(until:tolerance:)``: a wheel entry
/// whose firing resumes the task directly, on the thread that fires it.
///
/// The continuation is resumed exactly once, by whichever comes first of the
/// deadline and the task's cancellation; both take it out under the lock.
/// `@unchecked Sendable` invariant (the base class ``TimerEntry`` makes the
/// compiler leave it to us): every stored property is a `let` of a `Sendable`
/// type (the lock that guards the machine, atomics, the executor, the engine).
final class ClockSleep: TimerEntry, @unchecked Sendable {
    private struct State {
        var continuation: CheckedContinuation<Void, any Error>?
        var cancelled = false
        var finished = false
    }

    private let state = StateLock(State())
    /// How late a firing may come (see ``TimerEntry/leewayTicks``).
    private let leeway: Int64

    override var leewayTicks: Int64 { leeway }
    private let engine: TimerEngine

    private init(engine: TimerEngine, leeway: Int64) {
        self.engine = engine
        self.leeway = leeway
    }

    /// Sleeps until `deadline` (engine ticks) on `engine`.
    ///
    /// A deadline already past returns at once, without suspending (after a
    /// cancellation check), as `ContinuousClock` and swift-clocks' `TestClock` do;
    /// a deadline equal to the engine's now suspends until the engine next fires
    /// (under a manual scheduler, the next `advance`, even by `.zero`).
    static func sleep(on engine: TimerEngine, until deadline: Int64, leeway: Int64) async throws {
        if deadline < engine.nowTicks {
            try Task.checkCancellation()
            return
        }
        let sleep = ClockSleep(engine: engine, leeway: leeway)
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                // Armed and counted under the sleep's lock, so a cancel either
                // comes first (and nothing is armed or counted) or finds the
                // entry armed and counted, and disarms and uncounts it; a firing
                // likewise uncounts only what was counted.
                let ready = sleep.state.withLock { state -> [CheckedContinuation<Void, Never>]? in
                    guard !state.cancelled else { return nil }
                    state.continuation = continuation
                    engine.arm(sleep, at: deadline)
                    return engine.sleeperArmed()
                }
                guard let ready else {
                    continuation.resume(throwing: CancellationError())
                    return
                }
                for waiter in ready { waiter.resume() }
            }
        } onCancel: {
            sleep.cancel()
        }
    }

    private func cancel() {
        let continuation = state.withLock { state -> CheckedContinuation<Void, any Error>? in
            state.cancelled = true
            return state.continuation.take()
        }
        guard let continuation else { return }
        engine.disarm(self)
        engine.sleeperEnded()
        continuation.resume(throwing: CancellationError())
    }

    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        let continuation = state.withLock { $0.continuation.take() }
        guard let continuation else { return }
        engine.sleeperEnded()
        continuation.resume()
    }
}
