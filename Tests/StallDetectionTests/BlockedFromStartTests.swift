import CStallCapture
import Dispatch
import Foundation
import Testing

@testable import StallDetection

/// Blocks the calling thread in a function the report must name.
@inline(never)
func blockedFromStartBlocker(_ milliseconds: UInt32) {
    usleep(milliseconds * 1_000)
}

extension StallDetectorInProcessTests {
    /// A queue blocked before any probe has run (a `queue.sync` from another
    /// thread right after `start()`, as a test guard or an app's launch does):
    /// the queue's address is known from the target, so its drain lock names the
    /// blocked thread. (Learned from the probes alone, the detector found no
    /// thread, and the stall went unreported.)
    @Suite("A queue blocked from the detector's start", .serialized)
    struct BlockedFromStartTests {
        @Test("the queue's address is the one a probe on it answers with")
        func addressMatchesTheAnswer() {
            let queue = DispatchQueue(label: "blocked-from-start.address")
            let answered = queue.sync { ProbeAnswer.here().queue }
            #expect(StallDetector.Target.queue(queue).ownedQueueAddress == answered)
            #expect(answered != nil)
            #expect(StallDetector.Target.cooperativePool.ownedQueueAddress == nil)
        }

        @Test(
            "queue.sync from another thread at once after start(): started names the blocker, and ended",
            arguments: 0..<3)
        func syncRightAfterStart(round: Int) async {
            let queue = DispatchQueue(label: "blocked-from-start.\(round)")
            let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(100))
            let collector = CustomTargetTests.Collector(detector)
            detector.start()
            queue.sync { blockedFromStartBlocker(400) }
            await waitUntil { collector.snapshot.contains { $0.phase == .ended } }
            detector.stop()
            let events = await collector.finish()
            let started = events.first { $0.phase == .started }
            #expect(started != nil, "round \(round): lost")
            // A machine that kept the detector from looking until the queue had
            // answered gets a late report that says so (nothing could be sampled).
            if started?.lateness?.reportedAfterEnd != true {
                #expect(
                    started?.backtrace.frames.contains { $0.function?.contains("blockedFromStartBlocker") == true }
                        == true,
                    "round \(round): \(events)")
            }
            #expect(events.contains { $0.phase == .ended && !$0.endedByStop })
        }
    }
}
