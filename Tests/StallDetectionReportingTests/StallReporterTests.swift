import InMemoryLogging
import Logging
import MetricsTestKit
import Testing

@testable import StallDetection
@testable import StallDetectionReporting

@Suite("StallReporter")
struct StallReporterTests {
    func event(_ phase: StallEvent.Phase, milliseconds: Int64) -> StallEvent {
        StallEvent(
            id: 3, phase: phase, duration: .milliseconds(milliseconds), threshold: .milliseconds(250),
            target: "main queue",
            backtrace: StallBacktrace(
                frames: [
                    StackFrame(
                        address: 0x10, function: "slowThing()", file: "/a.swift", line: 1, image: "App",
                        isUncertain: false)
                ], threadID: 1, unavailableReason: nil),
            samplingTime: .milliseconds(1))
    }

    @Test("logs the report at started and the duration at ended, and records a count and a duration")
    func logsAndRecords() throws {
        let logs = InMemoryLogHandler()
        let metrics = TestMetrics()
        let reporter = StallReporter(
            logger: Logger(label: "test", factory: { _ in logs }), metricsPrefix: "stall", metricsFactory: metrics)
        reporter.record(event(.started, milliseconds: 262))
        reporter.record(event(.ended, milliseconds: 612))

        let entries = logs.entries
        #expect(entries.count == 2)
        #expect(entries.first?.level == .warning)
        #expect(entries.first?.message.description.contains("slowThing()") == true)
        #expect(entries.last?.level == .notice)
        #expect(entries.last?.metadata["stall.duration_ms"] == "612")

        let counter = try metrics.expectCounter("stall.count", [("target", "main queue")])
        #expect(counter.totalValue == 1)
        let timer = try metrics.expectTimer("stall.duration", [("target", "main queue")])
        #expect(timer.lastValue == 612_000_000)
    }
}
