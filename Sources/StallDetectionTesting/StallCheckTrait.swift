import StallDetection
import Testing

/// A Swift Testing trait that fails a test whose code stalls a target: the main
/// actor (`.mainQueue`), an executor (`.custom`), a queue, or the cooperative
/// pool. Each stall is one recorded issue whose text is the stall's report: how
/// long, the blocked thread's stack, and where the time went.
///
/// ```swift
/// import StallDetectionTesting
/// import Testing
///
/// @Test(.failsOnStall(of: .mainQueue, threshold: .milliseconds(100)))
/// @MainActor func layOutGallery() {
///     gallery.layOut()   // a 300 ms decode here fails the test, naming the decode
/// }
/// ```
///
/// On a suite it applies to each test, each with its own detector; on a
/// parameterized test, to each case. A detector starts before the test's code
/// and stops after it, once a stall can no longer be lost: a block posted to the
/// target after the test must run first (microseconds when nothing stalled), and
/// a stall being sampled or still going on is waited for (at most 10 s; one that
/// goes on longer is reported as cut short). A test that does not stall is
/// slower by that one round trip and the detector's start.
///
/// Swift Testing runs tests in parallel: a shared target (the main queue, the
/// cooperative pool) also sees other tests' stalls. Apply it to `.serialized`
/// suites for shared targets, or give the trait a queue or executor the test
/// owns. Under a debugger nothing is reported (see ``StallDetector``).
public struct StallCheckTrait: TestTrait, SuiteTrait, TestScoping {
    /// What is watched.
    public let target: StallDetector.Target
    /// How long the target may be blocked.
    public let threshold: Duration
    /// How often it is probed; nil for the detector's default.
    public let heartbeat: Duration?

    /// Applies to every test of a suite.
    public var isRecursive: Bool { true }

    /// A scope for each test case (never for a suite as a whole).
    public func scopeProvider(for test: Test, testCase: Test.Case?) -> Self? {
        testCase == nil ? nil : self
    }

    /// Runs the test's code with a detector on ``target``, and records an issue
    /// for each stall.
    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        let stallGuard = StallGuard(target: target, threshold: threshold, heartbeat: heartbeat)
        let outcome: Result<Void, any Error>
        do {
            try await function()
            outcome = .success(())
        } catch {
            outcome = .failure(error)
        }
        for event in await stallGuard.finish() {
            Issue.record(
                Comment(rawValue: StallGuard.failure(event, threshold: stallGuard.threshold)),
                sourceLocation: test.sourceLocation)
        }
        try outcome.get()
    }
}

extension Trait where Self == StallCheckTrait {
    /// Fails the test when its code blocks `target` for longer than `threshold`,
    /// with the stall's report as the issue.
    ///
    /// - Parameters:
    ///   - target: What to watch: `.mainQueue` for the main actor, `.custom` for an
    ///     executor (a SwiftNIO event loop, an actor's), `.queue`, or
    ///     `.cooperativePool`.
    ///   - threshold: How long the target may be blocked (as ``StallDetector``
    ///     takes it: zero, negative or too long values are clamped the same way).
    ///   - heartbeat: How often the target is probed; nil for the default (a
    ///     tenth of the threshold, from 5 to 50 ms).
    public static func failsOnStall(
        of target: StallDetector.Target, threshold: Duration = .milliseconds(250), heartbeat: Duration? = nil
    ) -> Self {
        StallCheckTrait(target: target, threshold: threshold, heartbeat: heartbeat)
    }
}
