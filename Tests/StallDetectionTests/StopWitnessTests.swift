import Testing

@testable import StallDetection

/// What the stop witness answers a look: a recorded continue after the look's
/// last one, and a continue not yet recorded after the wait (the witness woke
/// from its stop and got no CPU) as happening now, so that a stop on a starved
/// machine is never taken for a stall.
@Suite("StopWitness answers")
struct StopWitnessTests {
    @Test("a continue recorded after the last one seen is answered; an older one is not")
    func recorded() {
        #expect(StopWitness.answer(recorded: 500, after: 400, pendingAfterWait: false, now: 900) == 500)
        #expect(StopWitness.answer(recorded: 400, after: 400, pendingAfterWait: false, now: 900) == nil)
        #expect(StopWitness.answer(recorded: nil, after: 400, pendingAfterWait: false, now: 900) == nil)
    }

    @Test("a continue the witness has not recorded after the wait is answered as now, whatever was recorded before")
    func pending() {
        #expect(StopWitness.answer(recorded: nil, after: 400, pendingAfterWait: true, now: 900) == 900)
        #expect(StopWitness.answer(recorded: 300, after: 400, pendingAfterWait: true, now: 900) == 900)
        #expect(StopWitness.answer(recorded: 500, after: 400, pendingAfterWait: true, now: 900) == 900)
    }

    @Test("a continue answered as now renews what was owed: no stall from a stop the witness recorded late")
    func pendingContinueRenewsOwedAnswers() {
        let ms: Int64 = 1_000_000
        var machine = DetectorMachine(threshold: 250 * ms, heartbeat: 25 * ms, usesHeartbeat: true, now: 0)
        _ = machine.begin()
        _ = machine.watch(from: 0, inRunLoopPass: false)
        machine.posted(at: 25 * ms)
        // Stopped from 10 ms to 600 ms; the look at 610 ms waited 250 ms for the
        // witness, which still had not recorded the continue: answered as now.
        let now = 610 * ms
        let continued = StopWitness.answer(recorded: nil, after: 0, pendingAfterWait: true, now: now + 250 * ms)
        var unaware = machine
        let (look, _) = machine.look(now: now, continued: continued)
        #expect(look == .nothing)
        // Without the answer, the same look takes the stop for a stall.
        guard case (.sample, _) = unaware.look(now: now, continued: nil) else {
            Issue.record("a look 610 ms after the last answer, told of no continue, did not sample")
            return
        }
    }
}
