import Dispatch
import Foundation
import InMemoryLogging
import Logging
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

/// Real time (a real stall on a private queue), generous bounds; a broken
/// shutdown hangs the test rather than passing it.
@Suite("StallDetectionService in a ServiceGroup", .serialized)
struct StallDetectionServiceTests {
    /// A detector on a private queue, and a way to block that queue.
    func makeDetector() -> (StallDetector, DispatchQueue) {
        let queue = DispatchQueue(label: "test.service")
        return (
            StallDetector(target: .queue(queue), threshold: .milliseconds(100), heartbeat: .milliseconds(10)), queue
        )
    }

    @Test(
        "reports a stall through its reporter, and stops the detector on graceful shutdown",
        .disabled(if: underThreadSanitizer, "real-time bounds do not hold under ThreadSanitizer"))
    func gracefulShutdown() async throws {
        let logs = InMemoryLogHandler()
        let (detector, queue) = makeDetector()
        let service = StallDetectionService(
            detector: detector, reporter: StallReporter(logger: Logger(label: "stalls", factory: { _ in logs })))
        let group = ServiceGroup(services: [service], logger: Logger(label: "group", factory: { _ in logs }))
        let running = Task { try await group.run() }
        try await Task.sleep(for: .milliseconds(100))
        queue.async { serviceTestBlocker(400) }
        // Until the stall has ended and been logged (a loaded machine may take long
        // to sample a first stall; shutting down drops a sample under way).
        let deadline = ContinuousClock.now + .seconds(20)
        while !logs.entries.contains(where: { $0.metadata["stall.phase"] == "ended" }), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        await group.triggerGracefulShutdown()
        try await running.value
        let stalls = logs.entries.filter { $0.metadata["stall.phase"] != nil }
        #expect(stalls.map(\.level) == [.warning, .notice], "\(logs.entries)")
        #expect(stalls.first?.message.description.contains("serviceTestBlocker") == true)
        // The detector was stopped: its stream has ended and a second run returns at once.
        var after = 0
        for await _ in detector.events { after += 1 }
        #expect(after == 0)
        try await service.run()
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
