import Logging
import NIOCore
import StallDetection
import StallDetectionReporting

/// A service that watches every event loop of `group` with its own `StallDetector`
/// and reports through swift-log: the blocked loop's stack at `warning` while a stall
/// lasts, its duration at `notice` when it ends (and swift-metrics counters and timers,
/// if a metrics backend is bootstrapped).
///
/// Each detector posts its probe to its loop with `execute`; the report samples the
/// thread that last ran a probe, which is the loop's own thread: the stack shows
/// the handler that blocks it.
///
/// - Parameters:
///   - group: The event loops to watch (for this server, the ones that run every
///     request handler).
///   - threshold: How long a loop must be blocked to be reported.
///   - logger: Where the reports go.
/// - Returns: A swift-service-lifecycle `Service`: the application's service group
///   starts the detectors and stops them on graceful shutdown.
func makeEventLoopStallService(
    group: any EventLoopGroup, threshold: Duration, logger: Logger
) -> StallDetectionService {
    let detectors = group.makeIterator().enumerated().map { index, loop in
        StallDetector(
            target: .custom(name: "event loop \(index)") { probe in loop.execute(probe) },
            threshold: threshold)
    }
    return StallDetectionService(
        detectors: detectors, reporter: StallReporter(logger: logger, metricsPrefix: "server.stall"))
}
