import Dispatch
import Testing

@testable import StallDetection

/// Durations of any magnitude reach StallDetection through SafeTimers' one
/// saturating conversion: nothing traps. (In the serialized in-process suite:
/// detectors share one stop witness, which another test counts.)
extension StallDetectorInProcessTests {
    @Test("thresholds and heartbeats of any magnitude start and stop without trapping")
    func extremeThresholds() {
        let durations: [Duration] = [
            .seconds(Int64.max), .seconds(1e20), Duration(secondsComponent: .max, attosecondsComponent: .max),
            .seconds(-1e20), .zero, .nanoseconds(1),
        ]
        for threshold in durations {
            let detector = StallDetector(
                target: .queue(DispatchQueue(label: "extremes")), threshold: threshold, heartbeat: threshold)
            detector.start()
            detector.stop()
        }
    }

    @Test("durations of any magnitude format without trapping")
    func extremeFormatting() {
        #expect(format(.seconds(1e20)).hasSuffix(" s"))
        #expect(format(.milliseconds(1_500)) == "1.500 s")
    }
}
