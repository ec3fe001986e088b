import Testing

@testable import StallDetection

/// A late `.started` says how late and why (``StallEvent/Lateness``); an
/// on-time one says nothing.
@Suite("Late reports say why")
struct StallLatenessTests {
    func lateness(
        ms duration: Int64, sampling: Int64 = 2, waited: Int64 = 0, second: Bool = false, afterEnd: Bool = false
    ) -> StallEvent.Lateness? {
        StallEvent.Lateness(
            stallDuration: .milliseconds(duration), threshold: .milliseconds(250), heartbeat: .milliseconds(25),
            sampling: .milliseconds(sampling), lookWaited: .milliseconds(waited), confirmedBySecondLook: second,
            reportedAfterEnd: afterEnd)
    }

    @Test("made within the threshold plus one heartbeat: no lateness")
    func onTime() {
        #expect(lateness(ms: 250) == nil)
        #expect(lateness(ms: 270, sampling: 5) == nil)
        #expect(lateness(ms: 260, sampling: 0, afterEnd: true) == nil, "a short stall reported with its end is on time")
    }

    @Test("made late: the delay beyond the promise, sampling included, and each measured cause in the text")
    func late() throws {
        let starved = try #require(lateness(ms: 693, waited: 420))
        #expect(starved.delay == .milliseconds(420))
        #expect(starved.lookWaited == .milliseconds(420))
        #expect(
            starved.description
                == "reported 420 ms late: the detector's look ran 420 ms after it was due (its threads waited to run); sampling took 2 ms"
        )
        let slowNaming = try #require(lateness(ms: 276, sampling: 600))
        #expect(slowNaming.description == "reported 601 ms late: sampling took 600 ms")
        let confirmed = try #require(lateness(ms: 300, sampling: 0, second: true))
        #expect(confirmed.description == "reported 25 ms late: a second look confirmed the stall")
        let after = try #require(lateness(ms: 900, sampling: 0, waited: 600, afterEnd: true))
        #expect(after.description.hasSuffix("; the target answered before the stall could be reported"))
    }
}
