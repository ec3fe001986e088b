import Dispatch
import Foundation
import InMemoryLogging
import Logging
import MetricsTestKit
import ServiceLifecycle
import Testing

@testable import StallDetection
@testable import StallDetectionReporting

/// Whether this process runs under ThreadSanitizer (real-time bounds do not hold).
let underThreadSanitizer = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__tsan_init") != nil

/// Blocks the calling thread for `ms` milliseconds, in a function the log must name.
@inline(never)
func serviceTestBlocker(_ ms: UInt32) {
    usleep(ms * 1_000)
}

/// Polls `condition` every 10 ms until it holds or the poller itself has run for
/// `budget`: a gap of more than 250 ms between two polls does not count, since
/// the task that should make `condition` true shares the pool the poller was
/// starved of. (In one CI run of the whole parallel suite on two cores, a plain
/// 20 s deadline ran out with no lag window recorded; not reproduced since, and
/// a pool held by other tests is the likely cause.) Never longer than `limit`. Returns whether it held; says what it waited when it gives up.
func pollWhileScheduled(
    budget: Duration = .seconds(20), limit: Duration = .seconds(120), _ condition: () -> Bool
) async -> Bool {
    let end = ContinuousClock.now + limit
    var spent = Duration.zero
    var last = ContinuousClock.now
    var longestGap = Duration.zero
    while !condition() {
        let now = ContinuousClock.now
        let gap = now - last
        if gap <= .milliseconds(250) { spent += gap }
        longestGap = max(longestGap, gap)
        last = now
        if spent >= budget || now >= end {
            print("pollWhileScheduled: gave up after \(spent) scheduled, longest gap between polls \(longestGap)")
            return condition()
        }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return true
}

/// Real time (a real stall on a private queue), generous bounds; a broken
/// shutdown hangs the test rather than passing it.
@Suite("StallDetectionService in a ServiceGroup", .serialized)
struct StallDetectionServiceTests {
    /// A detector on a private queue behind `.custom`, and a switch that makes the
    /// queue's next probe block it for 400 ms (the probe's thread is then the
    /// blocked one, so the first sample confirms the stall however busy the test
    /// process is).
    func makeDetector() -> (StallDetector, Locked<Bool>) {
        let queue = DispatchQueue(label: "test.service")
        let blockNext = Locked(false)
        let detector = StallDetector(
            target: .custom(name: "service test queue") { probe in
                queue.async {
                    probe()
                    let block = blockNext.withLock { value in
                        defer { value = false }
                        return value
                    }
                    if block { serviceTestBlocker(400) }
                }
            },
            threshold: .milliseconds(100), heartbeat: .milliseconds(10))
        return (detector, blockNext)
    }

    @Test(
        "reports a stall through its reporter, and stops the detector on graceful shutdown",
        .disabled(if: underThreadSanitizer, "real-time bounds do not hold under ThreadSanitizer"))
    func gracefulShutdown() async throws {
        let logs = InMemoryLogHandler()
        let (detector, blockNext) = makeDetector()
        let service = StallDetectionService(
            detector: detector, reporter: StallReporter(logger: Logger(label: "stalls", factory: { _ in logs })))
        let group = ServiceGroup(services: [service], logger: Logger(label: "group", factory: { _ in logs }))
        let running = Task { try await group.run() }
        try await Task.sleep(for: .milliseconds(100))
        // Until the stall has ended and been logged (a loaded machine may take long
        // to sample a first stall; shutting down drops a sample under way). On a
        // starved machine the detector's thread may get no core until the 400 ms
        // block is over (one parallel CI-like run logged no warning naming the
        // blocker): the queue is blocked again every 3 s until a stall names it.
        var nextBlock = ContinuousClock.now
        func blockerStallEnded() -> Bool {
            let entries = logs.entries
            guard
                let id = entries.first(where: { $0.message.description.contains("serviceTestBlocker") })?
                    .metadata["stall.id"]
            else { return false }
            return entries.contains { $0.level == .notice && $0.metadata["stall.id"] == id }
        }
        _ = await pollWhileScheduled(budget: .seconds(30)) {
            if ContinuousClock.now >= nextBlock {
                blockNext.withLock { $0 = true }
                nextBlock = ContinuousClock.now + .seconds(3)
            }
            return blockerStallEnded()
        }
        await group.triggerGracefulShutdown()
        try await running.value
        // The blocker's stall: a warning naming it, then a notice with its id (a
        // starved parallel test run may add short stalls of its own).
        let warning = logs.entries.first {
            $0.level == .warning && $0.message.description.contains("serviceTestBlocker")
        }
        #expect(warning?.metadata["stall.target"] == "service test queue", "\(logs.entries)")
        #expect(
            logs.entries.contains {
                $0.level == .notice && $0.metadata["stall.id"] != nil
                    && $0.metadata["stall.id"] == warning?.metadata["stall.id"]
            })
        // The detector was stopped: its stream has ended and a second run returns at once.
        var after = 0
        for await _ in detector.events { after += 1 }
        #expect(after == 0)
        try await service.run()
    }

    @Test("records each detector's lag every lagInterval, and graceful shutdown still returns")
    func lagReachesMetrics() async throws {
        let metrics = TestMetrics()
        let (detector, blockNext) = makeDetector()
        let service = StallDetectionService(
            detector: detector, reporter: StallReporter(logger: nil, metricsFactory: metrics),
            lagInterval: .milliseconds(50))
        let group = ServiceGroup(
            services: [service], logger: Logger(label: "group", factory: { _ in SwiftLogNoOpLogHandler() }))
        let running = Task { try await group.run() }
        let target = [("target", "service test queue")]
        let recorded = await pollWhileScheduled { (try? metrics.expectGauge("stall.lag_max_seconds", target)) != nil }
        #expect(recorded, "no lag window recorded; the detector's current window: \(detector.lagSnapshot())")
        let p99 = try metrics.expectGauge("stall.lag_seconds", target + [("quantile", "0.99")])
        #expect(p99.lastValue.map { $0 >= 0 && $0 < 10 } == true, "\(String(describing: p99.lastValue))")
        let probes = try metrics.expectCounter("stall.lag_probes", target)
        #expect(probes.totalValue >= 1)
        _ = blockNext
        await group.triggerGracefulShutdown()
        try await running.value
        var after = 0
        for await _ in detector.events { after += 1 }
        #expect(after == 0)
    }

    @Test("stops the detector when the group's task is cancelled")
    func cancellation() async throws {
        let (detector, _) = makeDetector()
        let service = StallDetectionService(detector: detector, reporter: StallReporter(logger: nil))
        let group = ServiceGroup(
            services: [service], logger: Logger(label: "group", factory: { _ in SwiftLogNoOpLogHandler() }))
        let running = Task { try await group.run() }
        try await Task.sleep(for: .milliseconds(50))
        running.cancel()
        _ = try? await running.value
        var after = 0
        for await _ in detector.events { after += 1 }
        #expect(after == 0)
    }
}
