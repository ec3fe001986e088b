import Dispatch
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
) -> OffLoopService<StallDetectionService> {
    let detectors = group.makeIterator().enumerated().map { index, loop in
        StallDetector(
            target: .custom(name: "event loop \(index)") { probe in loop.execute(probe) },
            threshold: threshold)
    }
    return OffLoopService(
        StallDetectionService(
            detectors: detectors, reporter: StallReporter(logger: logger, metricsPrefix: "server.stall")),
        label: "stall reporting")
}

/// Runs a service's tasks on a dispatch queue of their own instead of the global
/// executor.
///
/// In this server the global executor *is* the event loops. A reporter task left
/// there may be scheduled on the very loop that is blocked, and then the `.started`
/// report (the one with the stack, sent while the stall lasts) is logged only when
/// the stall is over: seen in 2 of 6 tries of a 2 s stall. With a task executor
/// preference, the reporter and its child tasks run on `queue` whatever the loops do.
struct OffLoopService<Wrapped: Service>: Service {
    let wrapped: Wrapped
    let executor: DispatchQueueTaskExecutor

    init(_ wrapped: Wrapped, label: String) {
        self.wrapped = wrapped
        executor = DispatchQueueTaskExecutor(queue: DispatchQueue(label: label))
    }

    func run() async throws {
        try await withTaskExecutorPreference(executor) { try await wrapped.run() }
    }
}

/// A `TaskExecutor` that runs every job on one serial dispatch queue.
final class DispatchQueueTaskExecutor: TaskExecutor {
    let queue: DispatchQueue

    init(queue: DispatchQueue) { self.queue = queue }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
