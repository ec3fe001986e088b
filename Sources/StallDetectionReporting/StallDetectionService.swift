import ServiceLifecycle
import StallDetection

/// Runs stall detectors and reports their events, as a swift-service-lifecycle
/// `Service`: the detectors start when the `ServiceGroup` runs the service, and
/// stop on graceful shutdown or cancellation.
///
/// ```swift
/// import Logging
/// import ServiceLifecycle
/// import StallDetection
/// import StallDetectionReporting
///
/// let stalls = StallDetectionService(
///     detectors: [
///         StallDetector(target: .cooperativePool, threshold: .milliseconds(250)),
///         StallDetector(
///             target: .custom(name: "event loop 0") { probe in eventLoop.execute(probe) },
///             threshold: .milliseconds(100)),
///     ],
///     reporter: StallReporter(logger: Logger(label: "app.stalls")))
/// // Last in the list: a group shuts its services down in reverse order, so the
/// // detectors stop before the server's event loops go away.
/// let group = ServiceGroup(services: [stalls], gracefulShutdownSignals: [.sigterm], logger: Logger(label: "app"))
/// try await group.run()
/// ```
///
/// The service owns the detectors' ``StallDetection/StallDetector/events``
/// streams (iterate a stream from one task only) and starts and stops the
/// detectors itself. A stopped detector does not start again, so a service runs
/// once: a second ``run()`` returns at once.
///
/// Thread safety: `Sendable`; ``run()`` is called by the service group.
public struct StallDetectionService: Service {
    /// The detectors the service runs.
    public let detectors: [StallDetector]
    /// Where their events go.
    public let reporter: StallReporter
    /// How often each detector's lag window is recorded (see
    /// ``StallReporter/recordLag(_:target:)``); nil records none.
    public let lagInterval: Duration?

    /// Creates a service that runs `detectors` and sends their events to `reporter`.
    ///
    /// - Parameters:
    ///   - detectors: Detectors that have not been started or stopped (the service
    ///     starts them).
    ///   - reporter: Logs and records every event.
    ///   - lagInterval: How often each detector's lag percentiles go to
    ///     `reporter`'s metrics; nil, zero or negative for never.
    public init(detectors: [StallDetector], reporter: StallReporter, lagInterval: Duration? = .seconds(10)) {
        self.detectors = detectors
        self.reporter = reporter
        self.lagInterval = lagInterval.flatMap { $0 > .zero ? $0 : nil }
    }

    /// Creates a service that runs one detector.
    ///
    /// - Parameters:
    ///   - detector: A detector that has not been started or stopped.
    ///   - reporter: Logs and records every event.
    ///   - lagInterval: How often the detector's lag percentiles go to
    ///     `reporter`'s metrics; nil, zero or negative for never.
    public init(detector: StallDetector, reporter: StallReporter, lagInterval: Duration? = .seconds(10)) {
        self.init(detectors: [detector], reporter: reporter, lagInterval: lagInterval)
    }

    /// Starts the detectors and reports their events until graceful shutdown or
    /// cancellation, then stops them. Returns once every detector has stopped and
    /// every event it produced has been reported.
    public func run() async throws {
        let detectors = self.detectors
        let reporter = self.reporter
        let lagInterval = self.lagInterval
        for detector in detectors { detector.start() }
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                // `true` from an event stream's task, `false` from the lag task,
                // which ends when the streams have (the detectors stopped).
                await withTaskGroup(of: Bool.self) { group in
                    for detector in detectors {
                        group.addTask {
                            await reporter.report(detector.events)
                            return true
                        }
                    }
                    if let lagInterval {
                        group.addTask {
                            await reporter.reportLag(of: detectors, every: lagInterval)
                            return false
                        }
                    }
                    var streams = detectors.count
                    while streams > 0, let isStream = await group.next() {
                        if isStream { streams -= 1 }
                    }
                    group.cancelAll()
                }
            } onGracefulShutdown: {
                for detector in detectors { detector.stop() }
            }
        } onCancel: {
            for detector in detectors { detector.stop() }
        }
        for detector in detectors { detector.stop() }
    }
}
