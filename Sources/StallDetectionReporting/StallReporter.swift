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
/// - Lag (``recordLag(_:target:)``, ``reportLag(of:every:)``, and
///   ``StallDetectionService`` every `lagInterval`): per window of a detector's
///   ``StallDetection/StallDetector/LagSnapshot``, gauges in seconds
///   `<prefix>.lag_seconds` with the dimensions `target` and `quantile` (`0.5`,
///   `0.9`, `0.99`, `0.999`), `<prefix>.lag_max_seconds` and
///   `<prefix>.lag_mean_seconds` with the dimension `target`, and a counter
///   `<prefix>.lag_probes` incremented by the window's probe count. A Prometheus
///   backend shows `stall_lag_seconds{target="event loop 3",quantile="0.99"}`. A
///   window without a probe sets no gauge (the last window's values stay).
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

    /// Records one window of a detector's lag (see the type's discussion for the
    /// metrics); nothing when the reporter records no metrics.
    ///
    /// - Parameters:
    ///   - lag: The window, usually `detector.lagSnapshot(reset: true)`.
    ///   - target: The `target` dimension: the detector's `target.description`,
    ///     as in its events.
    public func recordLag(_ lag: StallDetector.LagSnapshot, target: String) {
        guard let metricsPrefix, lag.count > 0 else { return }
        let dimensions = [("target", target)]
        let quantiles: [(String, Duration)] = [
            ("0.5", lag.p50), ("0.9", lag.p90), ("0.99", lag.p99), ("0.999", lag.p999),
        ]
        for (quantile, value) in quantiles {
            gauge("\(metricsPrefix).lag_seconds", dimensions + [("quantile", quantile)]).record(Self.seconds(value))
        }
        gauge("\(metricsPrefix).lag_max_seconds", dimensions).record(Self.seconds(lag.max))
        gauge("\(metricsPrefix).lag_mean_seconds", dimensions).record(Self.seconds(lag.mean))
        let label = "\(metricsPrefix).lag_probes"
        let counter =
            metricsFactory.map { Counter(label: label, dimensions: dimensions, factory: $0) }
            ?? Counter(label: label, dimensions: dimensions)
        counter.increment(by: Int64(lag.count))
    }

    /// Every `interval`, records a new lag window of each detector (taken with
    /// `reset`, so each probe counts in one window), until the calling task is
    /// cancelled. A zero or negative `interval` records nothing and returns at once;
    /// one longer than a hundred years counts as a hundred years.
    ///
    /// ```swift
    /// let reporter = StallReporter(logger: Logger(label: "app.stalls"))
    /// let lagReporting = Task { await reporter.reportLag(of: [detector], every: .seconds(10)) }
    /// // …
    /// lagReporting.cancel()
    /// ```
    public func reportLag(of detectors: [StallDetector], every interval: Duration) async {
        guard interval > .zero else { return }
        // `Task.sleep` traps on a duration past Int64 nanoseconds: a hundred years
        // is as good as never.
        let interval = min(interval, StallDetector.longestThreshold)
        for detector in detectors { detector.resetLag() }
        while (try? await Task.sleep(for: interval)) != nil {
            for detector in detectors {
                recordLag(detector.lagSnapshot(reset: true), target: detector.target.description)
            }
        }
    }

    private func gauge(_ label: String, _ dimensions: [(String, String)]) -> Gauge {
        metricsFactory.map { Gauge(label: label, dimensions: dimensions, factory: $0) }
            ?? Gauge(label: label, dimensions: dimensions)
    }

    private static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// Records every event of `events` until the stream ends (at the detector's `stop()`).
    public func report(_ events: AsyncStream<StallEvent>) async {
        for await event in events { record(event) }
    }
}
