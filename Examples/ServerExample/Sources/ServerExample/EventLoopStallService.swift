import Logging
import NIOCore
import ServiceLifecycle
import StallDetection
import StallDetectionReporting

/// A service that watches every event loop of `group` with its own `StallDetector`
/// and reports through swift-log: the blocked loop's stack at `warning` while a stall
/// lasts, its duration at `notice` when it ends (and swift-metrics counters and timers,
/// if a metrics backend is bootstrapped).
///
/// Each detector posts its probe to its loop with `execute`; the report samples the
/// thread that last ran a probe, which is the loop's own thread: the stack shows
/// the handler that blocks it. Each detector hands its events to the reporter
/// through `onEvent`, on a queue of the detector's own: no task reads them, so no
/// report waits for a task to be scheduled on the loop that is blocked (in this
/// server the global executor *is* the event loops).
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
) -> StallDetectorsService {
    let reporter = StallReporter(logger: logger, metricsPrefix: "server.stall")
    let detectors = group.makeIterator().enumerated().map { index, loop in
        StallDetector(
            target: .custom(name: "event loop \(index)") { probe in loop.execute(probe) },
            threshold: threshold, onEvent: reporter.record)
    }
    return StallDetectorsService(detectors: detectors)
}

/// Starts detectors that report through their `onEvent` handlers, and stops them
/// on graceful shutdown or cancellation (`stop()` returns once no handler runs).
struct StallDetectorsService: Service {
    let detectors: [StallDetector]

    func run() async throws {
        let detectors = detectors
        for detector in detectors { detector.start() }
        await withTaskCancellationHandler {
            try? await gracefulShutdown()
        } onCancel: {
            for detector in detectors { detector.stop() }
        }
        for detector in detectors { detector.stop() }
    }
}
