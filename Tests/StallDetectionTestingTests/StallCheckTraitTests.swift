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
    /// must be a stall of `target`, and at least one is recorded. One of them
    /// must name the blocker, unless every stall lasted over a second longer
    /// than `body`: then another suite's stall began first and took ours in
    /// (the whole suite held the pool for 8.7 s in one CI run), and its report
    /// shows that suite's threads, rightly.
    func sharedTargetFails(
        _ trait: StallCheckTrait, target: String, _ body: @escaping @Sendable () async throws -> Void
    ) async throws {
        let stalls = Texts()
        let bodyTook = Texts()
        try await withKnownIssue {
            try await scoped(trait) {
                let began = ContinuousClock.now
                try await body()
                bodyTook.append("\(Self.seconds(ContinuousClock.now - began))")
            }
        } matching: { issue in
            let text = issue.comments.map(\.rawValue).joined(separator: "\n")
            guard text.contains("stalled \(target)") else { return false }
            stalls.append(text)
            return true
        }
        let took = bodyTook.all.first.flatMap(Double.init) ?? 0
        let lengths = stalls.all.map(Self.stallSeconds)
        if lengths.allSatisfy({ $0 > took + 1 }) {
            print("\(target): stalls of \(lengths) s took in the body's \(took) s (other suites)")
            return
        }
        #expect(stalls.all.contains { namesBlocker($0, target: target) }, "\(stalls.all)")
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// The length in a report's "was blocked for 0.612 s" (0 when absent).
    static func stallSeconds(_ text: String) -> Double {
        guard let range = text.range(of: "blocked for ") else { return 0 }
        var rest = text[range.upperBound...]
        if rest.hasPrefix("at least ") { rest = rest.dropFirst("at least ".count) }
        return Double(rest.prefix { $0.isNumber || $0 == "." }) ?? 0
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
        #expect(events.count == 1, "\(events)")
        let text = events.first.map { StallGuard.failure($0, threshold: .milliseconds(100)) } ?? ""
        #expect(namesBlocker(text, target: "queue 'stall-check.sync'"), "\(text)")
    }
}
