import Testing

@testable import StallDetection

/// Runs each test case of a suite on a thread of its own (a ``DetectorWorker``
/// as the test's task executor) instead of a thread of the cooperative pool.
///
/// The pool has one thread per core, two on a 2-core machine, and Swift Testing
/// runs a synchronous test on one of them: a test that waits for a child
/// process, or sleeps while a stall is staged, held it for its whole run, and
/// the other suites' tests waited for it. Given to the suites whose tests
/// block.
struct OwnThreadTrait: TestTrait, SuiteTrait, TestScoping {
    var isRecursive: Bool { true }

    /// A scope for each test case (never for a suite as a whole).
    func scopeProvider(for test: Test, testCase: Test.Case?) -> Self? {
        testCase == nil ? nil : self
    }

    func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        let thread = DetectorWorker(name: "TestCase")
        defer { thread.finish() }
        try await withTaskExecutorPreference(thread) { try await function() }
    }
}

extension Trait where Self == OwnThreadTrait {
    /// Each test case runs on a thread of its own, not on the cooperative pool.
    static var onThreadsOfTheirOwn: Self { Self() }
}

@Suite("OwnThreadTrait", .onThreadsOfTheirOwn)
struct OwnThreadTraitTests {
    @Test("a synchronous test runs on a thread of its own, not on the cooperative pool")
    func synchronousTest() {
        #expect(currentThreadName() == "TestCase")
    }

    @Test("an asynchronous test too, after an await")
    func asynchronousTest() async {
        await Task.yield()
        #expect(currentThreadName() == "TestCase")
    }
}
