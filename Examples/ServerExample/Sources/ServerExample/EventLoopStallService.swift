import Logging
import NIOCore
import ServiceLifecycle
import StallDetection
import StallDetectionReporting
import StallDetectionTracing

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
///   - loops: The event loops to watch (for this server, the ones that run every
///     request handler), with their names.
///   - threshold: How long a loop must be blocked to be reported.
///   - logger: Where the reports go.
///   - stallTracer: Also records each stall in traces: a span of its own, and
///     events on the spans of requests in flight on the stalled loop.
/// - Returns: A swift-service-lifecycle `Service`: the application's service group
///   starts the detectors and stops them on graceful shutdown.
func makeEventLoopStallService(
    loops: EventLoopNames, threshold: Duration, logger: Logger, tracer stallTracer: StallTracer
) -> StallDetectorsService {
    let reporter = StallReporter(logger: logger, metricsPrefix: "server.stall")
    let detectors = loops.all.map { loop, name in
        StallDetector(
            target: .custom(name: name) { probe in loop.execute(probe) },
            threshold: threshold,
            onEvent: { event in
                reporter.record(event)
                stallTracer.record(event)
            })
    }
    return StallDetectorsService(detectors: detectors)
}

/// The name of each event loop of a group ("event loop 0", ...): the target of its
/// stall detector, and what a request's span is in flight on.
struct EventLoopNames: Sendable {
    let all: [(loop: any EventLoop, name: String)]
    private let names: [ObjectIdentifier: String]

    init(group: any EventLoopGroup) {
        all = group.makeIterator().enumerated().map { index, loop in (loop, "event loop \(index)") }
        names = Dictionary(uniqueKeysWithValues: all.map { (ObjectIdentifier($0.loop), $0.name) })
    }

    func name(of loop: any EventLoop) -> String {
        names[ObjectIdentifier(loop)] ?? "event loop ?"
    }
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
