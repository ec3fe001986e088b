import Dispatch
import Foundation
import StallDetection
import Synchronization
import Testing

@testable import StallDetectionTesting

/// Blocks the calling thread in a function the failure must name.
@inline(never)
func stallCheckBlocker(_ milliseconds: UInt32) {
    usleep(milliseconds * 1_000)
}

let stallCheckQueue = DispatchQueue(label: "stall-check.quiet")

/// Texts gathered from a matcher that may run on any thread.
final class Texts: Sendable {
    private let texts = Mutex<[String]>([])
    func append(_ text: String) { texts.withLock { $0.append(text) } }
    var all: [String] { texts.withLock { $0 } }
}

/// Whether one of `issue`'s comments names the blocker and the target.
func namesBlocker(_ issue: Issue, target: String) -> Bool {
    issue.comments.contains {
        $0.rawValue.contains("stallCheckBlocker") && $0.rawValue.contains("stalled \(target)")
    }
}

@Suite("StallCheckTrait and XCTAssertNoStall", .serialized)
struct StallCheckTraitTests {
    /// Runs `body` inside the trait's scope, as Swift Testing would for a test
    /// that carries it.
    func scoped(
        _ trait: StallCheckTrait, _ body: @escaping @Sendable () async throws -> Void
    ) async throws {
        let test = try #require(Test.current)
        try await trait.provideScope(for: test, testCase: Test.Case.current, performing: body)
    }

    @Test("a test that blocks a queue past the threshold fails, its issue naming the blocking function")
    func blockedQueueFails() async throws {
        let queue = DispatchQueue(label: "stall-check.blocked")
        try await withKnownIssue {
            try await scoped(.failsOnStall(of: .queue(queue), threshold: .milliseconds(100))) {
                queue.sync { stallCheckBlocker(300) }
            }
        } matching: {
            namesBlocker($0, target: "queue 'stall-check.blocked'")
        }
    }

    /// The hardest moment: the block ends as the test returns, before the probe
    /// it held up has answered (threshold 100 ms, heartbeat 50 ms, block 200 ms,
    /// so a stall however late the block began after the detector's start).
    @Test("a block that ends as the test returns is still reported", arguments: 0..<5)
    func blockEndingAtReturn(round: Int) async throws {
        let queue = DispatchQueue(label: "stall-check.edge")
        let trait = StallCheckTrait.failsOnStall(
            of: .queue(queue), threshold: .milliseconds(100), heartbeat: .milliseconds(50))
        try await withKnownIssue("round \(round)") {
            try await scoped(trait) { queue.sync { stallCheckBlocker(200) } }
        } matching: {
            namesBlocker($0, target: "queue 'stall-check.edge'")
        }
    }

    /// Runs `body` in the trait's scope on a target the whole test process
    /// shares (other suites run in parallel and may stall it too): every issue
    /// must be a stall of `target`, and one of them must name the blocker.
    func sharedTargetFails(
        _ trait: StallCheckTrait, target: String, _ body: @escaping @Sendable () async throws -> Void
    ) async throws {
        let stalls = Texts()
        try await withKnownIssue {
            try await scoped(trait, body)
        } matching: { issue in
            let text = issue.comments.map(\.rawValue).joined(separator: "\n")
            guard text.contains("stalled \(target)") else { return false }
            stalls.append(text)
            return true
        }
        #expect(stalls.all.contains { $0.contains("stallCheckBlocker") }, "\(stalls.all)")
    }

    @Test("the main actor blocked by the test fails it")
    func mainActorBlocked() async throws {
        try await sharedTargetFails(.failsOnStall(of: .mainQueue, threshold: .milliseconds(100)), target: "main queue")
        {
            await MainActor.run { stallCheckBlocker(300) }
        }
    }

    /// The failure holds every pool thread's stack: the blocker's is among them
    /// however many threads other tests held at the time.
    @Test("the cooperative pool blocked on every thread fails the test")
    func poolBlocked() async throws {
        let width = ProcessInfo.processInfo.activeProcessorCount
        let trait = StallCheckTrait.failsOnStall(of: .cooperativePool, threshold: .milliseconds(150))
        try await sharedTargetFails(trait, target: "cooperative pool") {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<width { group.addTask { stallCheckBlocker(500) } }
            }
        }
    }

    @Test("the test's own error is rethrown, and its stall recorded too")
    func errorAndStall() async throws {
        struct Expected: Error {}
        let queue = DispatchQueue(label: "stall-check.throwing")
        await withKnownIssue {
            await #expect(throws: Expected.self) {
                try await scoped(.failsOnStall(of: .queue(queue), threshold: .milliseconds(100))) {
                    queue.sync { stallCheckBlocker(300) }
                    throw Expected()
                }
            }
        } matching: {
            namesBlocker($0, target: "queue 'stall-check.throwing'")
        }
    }

    /// With a 1 s heartbeat, an end that waited for a probe or a look would take
    /// a second: this one takes one round trip to the queue.
    @Test("a test that does not stall passes, and its end waits for no heartbeat")
    func quietTestIsNotSlowed() async throws {
        let trait = StallCheckTrait.failsOnStall(
            of: .queue(stallCheckQueue), threshold: .seconds(10), heartbeat: .seconds(1))
        let began = ContinuousClock.now
        try await scoped(trait) { stallCheckQueue.sync { stallCheckBlocker(5) } }
        let took = ContinuousClock.now - began
        #expect(took < .milliseconds(500), "\(took)")
    }

    @Test(
        "applied as a trait: a test that does not stall passes",
        .failsOnStall(of: .queue(stallCheckQueue), threshold: .milliseconds(200)))
    func appliedAsTrait() {
        stallCheckQueue.sync { stallCheckBlocker(20) }
    }

    @Test("the synchronous end (XCTest's) reports a queue's stall that ended before it")
    func synchronousEnd() {
        let queue = DispatchQueue(label: "stall-check.sync")
        let stallGuard = StallGuard(target: .queue(queue), threshold: .milliseconds(100), heartbeat: nil)
        queue.sync { stallCheckBlocker(300) }
        let events = stallGuard.finishSynchronously(callerIsTarget: false)
        #expect(events.count == 1, "\(events)")
        #expect(
            events.first.map { StallGuard.failure($0, threshold: .milliseconds(100)) }?.contains("stallCheckBlocker")
                == true)
    }
}
