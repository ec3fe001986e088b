import Logging
import Metrics
import SafeTimers
import StallDetection

/// Sends ``StallDetection/StallEvent``s to swift-log and swift-metrics.
///
/// ```swift
/// import StallDetection
/// import StallDetectionReporting
///
/// let detector = StallDetector(target: .mainQueue)
/// detector.start()
/// let reporter = StallReporter(logger: Logger(label: "app.stalls"))
/// Task { await reporter.report(detector.events) }
/// ```
///
/// - Logging: `.started` at `warning` level with the whole report (phase, duration,
///   stack) as the message; `.ended` at `notice` level with the duration. Metadata:
///   `stall.id`, `stall.phase`, `stall.duration_ms`, `stall.target`.
/// - Metrics: a counter `<prefix>.count` incremented once per stall (at `.started`),
///   and a timer `<prefix>.duration` that records each stall's total duration (at
///   `.ended`), with the dimension `target`.
///
/// This product depends on swift-log and swift-metrics; the `StallDetection` and
/// `SafeTimers` products do not.
public struct StallReporter: Sendable {
    private let logger: Logger?
    private let metricsPrefix: String?
    private let metricsFactory: (any MetricsFactory)?

    /// Creates a reporter.
    ///
    /// - Parameters:
    ///   - logger: Where to log events; `nil` to log nothing.
    ///   - metricsPrefix: The label prefix of the metrics; `nil` to record none.
    ///   - metricsFactory: Where metrics go; `nil` (the default) for the one
    ///     bootstrapped in `MetricsSystem`.
    public init(logger: Logger?, metricsPrefix: String? = "stall", metricsFactory: (any MetricsFactory)? = nil) {
        self.logger = logger
        self.metricsPrefix = metricsPrefix
        self.metricsFactory = metricsFactory
    }

    /// Logs and records one event.
    public func record(_ event: StallEvent) {
        let milliseconds = DeadlineArithmetic.milliseconds(event.duration)
        let metadata: Logger.Metadata = [
            "stall.id": "\(event.id)",
            "stall.phase": "\(event.phase.rawValue)",
            "stall.duration_ms": "\(Int(milliseconds.rounded()))",
            "stall.target": "\(event.target)",
        ]
        switch event.phase {
        case .started:
            logger?.warning("\(event.description)", metadata: metadata)
            if let metricsPrefix {
                let label = "\(metricsPrefix).count"
                let dimensions = [("target", event.target)]
                let counter =
                    metricsFactory.map { Counter(label: label, dimensions: dimensions, factory: $0) }
                    ?? Counter(label: label, dimensions: dimensions)
                counter.increment()
            }
        case .ended:
            logger?.notice(
                "stall #\(event.id) ended: \(event.target) was blocked for \(Int(milliseconds.rounded())) ms",
                metadata: metadata)
            if let metricsPrefix {
                let label = "\(metricsPrefix).duration"
                let dimensions = [("target", event.target)]
                let timer =
                    metricsFactory.map { Metrics.Timer(label: label, dimensions: dimensions, factory: $0) }
                    ?? Metrics.Timer(label: label, dimensions: dimensions)
                timer.recordNanoseconds(Int64(milliseconds * 1_000_000))
            }
        }
    }

    /// Records every event of `events` until the stream ends (at the detector's `stop()`).
    public func report(_ events: AsyncStream<StallEvent>) async {
        for await event in events { record(event) }
    }
}
