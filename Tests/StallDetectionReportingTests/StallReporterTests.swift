import Dispatch
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

    @Test(
        "a lag window sets the percentile, max and mean gauges in seconds and counts its probes; an empty one sets none"
    )
    func recordsLag() throws {
        let metrics = TestMetrics()
        let reporter = StallReporter(logger: nil, metricsPrefix: "stall", metricsFactory: metrics)
        var histogram = LagHistogram()
        for _ in 0..<999 { histogram.record(100_000) }
        histogram.record(40_000_000)
        reporter.recordLag(StallDetector.LagSnapshot(histogram: histogram, window: 10_000_000_000), target: "loop 3")
        let target = [("target", "loop 3")]
        let p50 = try metrics.expectGauge("stall.lag_seconds", target + [("quantile", "0.5")])
        #expect(abs((p50.lastValue ?? 0) - 100e-6) < 2e-6)
        let p999 = try metrics.expectGauge("stall.lag_seconds", target + [("quantile", "0.999")])
        #expect(abs((p999.lastValue ?? 0) - 100e-6) < 2e-6, "rank 999 of 1000")
        #expect(try metrics.expectGauge("stall.lag_max_seconds", target).lastValue == 0.04)
        let mean = try metrics.expectGauge("stall.lag_mean_seconds", target).lastValue ?? 0
        #expect(abs(mean - (999 * 100e-6 + 0.04) / 1000) < 1e-9)
        #expect(try metrics.expectCounter("stall.lag_probes", target).totalValue == 1000)

        reporter.recordLag(StallDetector.LagSnapshot(histogram: LagHistogram(), window: 1), target: "loop 4")
        #expect((try? metrics.expectGauge("stall.lag_max_seconds", [("target", "loop 4")])) == nil)
        let silent = StallReporter(logger: nil, metricsPrefix: nil, metricsFactory: metrics)
        silent.recordLag(StallDetector.LagSnapshot(histogram: histogram, window: 1), target: "loop 5")
        #expect((try? metrics.expectGauge("stall.lag_max_seconds", [("target", "loop 5")])) == nil)
    }

    @Test("reportLag with an interval past Int64 nanoseconds waits, and returns when cancelled")
    func hugeLagInterval() async {
        let detector = StallDetector(target: .queue(DispatchQueue(label: "huge-interval")), threshold: .seconds(1))
        detector.start()
        let reporter = StallReporter(logger: nil, metricsFactory: TestMetrics())
        let reporting = Task { await reporter.reportLag(of: [detector], every: .seconds(Int64.max)) }
        try? await Task.sleep(for: .milliseconds(50))
        reporting.cancel()
        await reporting.value
        detector.stop()
    }
}
