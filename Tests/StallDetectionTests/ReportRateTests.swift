import Foundation
import Testing

/// How often a report is wrong, false or lost, over many runs beside two busy
/// processes: too long for the normal suite, so run only when
/// `SAFETIMERS_RATE_RUNS` gives the number of runs (200 for the promise), with
/// the debug helper or a release one (`STALL_PROBE`):
///
/// ```sh
/// SAFETIMERS_RATE_RUNS=200 swift test --filter ReportRateTests
/// ```
///
/// Each test prints its rates (`RATE …` lines) and fails on any wrong, false or
/// lost report; a late one is counted and printed, not failed (a real-time
/// bound the machine can miss).
/// `SAFETIMERS_RATE_RUNS`, or 0.
let reportRateRuns = ProcessInfo.processInfo.environment["SAFETIMERS_RATE_RUNS"].flatMap { Int($0) } ?? 0

@Suite(
    "Report rates over many runs, beside two busy processes (SAFETIMERS_RATE_RUNS)", .serialized,
    .enabled(if: reportRateRuns > 0, "set SAFETIMERS_RATE_RUNS to the number of runs"),
    .disabled(if: underThreadSanitizer, "real-time rates do not hold under ThreadSanitizer"))
struct ReportRateTests {
    static var build: String { ProbeRun.probeIsRelease ? "release" : "debug" }

    @Test("a detector per queue or event loop (4 per core), all stalled at once: none blames another target, none lost")
    func manyDetectors() throws {
        let count = 4 * ProcessInfo.processInfo.activeProcessorCount
        for scenario in ["many-queues", "many-loops"] {
            var total = RealConditionTests.ManyDetectors()
            var failedRuns: [String] = []
            try ProbeRun.withBurners(2) {
                for _ in 0..<reportRateRuns {
                    let run = try ProbeRun.run([scenario, "\(count)"])
                    let result = RealConditionTests.ManyDetectors(run, count: count)
                    total.add(result)
                    if result.wrong + result.lost + result.shortEnded + result.unavailable - result.lateUnavailable > 0
                    {
                        failedRuns.append("\(result): \(run.lines.filter { $0.hasPrefix("DETECTOR") })")
                    }
                }
            }
            print("RATE \(scenario) \(Self.build) \(reportRateRuns) runs × \(count) detectors: \(total)")
            #expect(total.wrong == 0, "a detector blamed another target: \(failedRuns)")
            #expect(total.shortEnded == 0, "an .ended shorter than its .started: \(failedRuns)")
            // A stall the detector saw only after it ended has no stack to take:
            // late, counted and printed, not lost.
            #expect(total.lost == 0 && total.unavailable == total.lateUnavailable, "\(failedRuns)")
        }
    }

    @Test("SIGSTOP/SIGCONT at nice 19 beside two busy processes: no false stall in any stop")
    func stops() throws {
        let lengths = StallDetectorIntegrationTests.stopLengths
        var stops = 0
        var falseStalls: [String] = []
        try ProbeRun.withBurners(2) {
            while stops < reportRateRuns {
                let chunk = Array(lengths.prefix(reportRateRuns - stops))
                let run = try StallDetectorIntegrationTests.stopAndContinue(chunk)
                stops += chunk.count
                falseStalls += run.events.map(\.report)
                #expect(run.exitStatus == 0)
            }
        }
        print("RATE stops \(Self.build) \(stops) stops at nice 19: \(falseStalls.count) events")
        #expect(falseStalls.isEmpty, "\(falseStalls)")
    }
}
