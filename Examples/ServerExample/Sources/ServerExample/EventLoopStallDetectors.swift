import Dispatch
import Logging
import NIOCore
import SafeTimers
import StallDetection
import StallDetectionReporting

/// One `StallDetector` per event loop of `group`, each reporting through a
/// `StallReporter` (swift-log at `warning` with the blocked loop's stack, `notice`
/// when the stall ends; swift-metrics counters and timers if a backend is
/// bootstrapped).
final class EventLoopStallDetectors: Sendable {
    private let detectors: [StallDetector]
    private let pumps: [RepeatingTimer]

    /// Creates and starts the detectors.
    ///
    /// - Parameters:
    ///   - group: The event loops to watch (for this server, the ones that run every
    ///     request handler).
    ///   - threshold: How long a loop must be blocked to be reported.
    ///   - logger: Where the reports go.
    init(group: any EventLoopGroup, threshold: Duration, logger: Logger) {
        var detectors: [StallDetector] = []
        var pumps: [RepeatingTimer] = []
        for (index, loop) in group.makeIterator().enumerated() {
            // FALLBACK until `.custom(name:post:)` lands: a bridge queue that waits for
            // the loop. The detector sees the loop's stall, but samples the bridge's
            // waiting thread, not the loop's: the report cannot name the handler.
            let bridge = DispatchQueue(label: "event loop \(index) (bridge)")
            let pump = RepeatingTimer(interval: .milliseconds(10), queue: bridge) {
                _ = try? loop.submit {}.wait()
            }
            pump.start()
            pumps.append(pump)
            detectors.append(StallDetector(target: .queue(bridge), threshold: threshold))
        }
        self.detectors = detectors
        self.pumps = pumps
        let reporter = StallReporter(logger: logger, metricsPrefix: "server.stall")
        for detector in detectors {
            detector.start()
            Task { await reporter.report(detector.events) }
        }
    }

    /// Stops every detector; their reporters' tasks end with the event streams.
    func stop() {
        for detector in detectors { detector.stop() }
        for pump in pumps { pump.cancel() }
    }
}
