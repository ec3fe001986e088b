import Testing

@testable import SafeTimers

/// The interleaving explorer over every primitive: every sequence of steps up
/// to the depth below, then seeded random paths deeper than that. Each step is
/// a public call from the caller thread or from inside the handler, the engine
/// firing, a delivered handler beginning or ending, a blocked cancel returning,
/// or time passing. Invariants are checked after every step and at rest.
@Suite("Interleaving explorer")
struct ExplorationTests {
    /// Exhaustive depth; under ThreadSanitizer (which adds nothing to this
    /// single-threaded search but slows it tenfold) one less.
    static let depth = ThreadSanitizerAnnotations.isActive ? 5 : 6
    static let randomRuns = ThreadSanitizerAnnotations.isActive ? 300 : 3_000
    static let randomDepth = 40

    /// `extraDepth` deepens the search for systems with few steps per state.
    static func check<System: ExplorableSystem>(_ system: System.Type, _ name: String, extraDepth: Int = 0) {
        let depth = Self.depth + extraDepth
        let exhaustive = Explorer.exhaustive(System.self, depth: depth)
        print("explorer: \(name), exhaustive to depth \(depth): \(exhaustive)")
        #expect(exhaustive.counterexample == nil, "\(name): \(exhaustive)")
        let random = Explorer.random(System.self, runs: randomRuns, depth: randomDepth, seed: 0x5AFE)
        print("explorer: \(name), \(randomRuns) random paths of \(randomDepth) steps: \(random)")
        #expect(random.counterexample == nil, "\(name): \(random)")
    }

    @Test("the explorer finds the overlap in a RepeatingTimer state machine without an invocation gate")
    func findsTheOverlapOfTheMachineWithoutAGate() {
        let report = Explorer.exhaustive(OverlappingRepeatingTimerSystem.self, depth: 8)
        print("explorer: RepeatingTimer state machine without a gate: \(report)")
        #expect(report.counterexample?.violation == "two invocations of the handler overlap")
        #expect(report.counterexample?.steps.count == 8)
    }

    @Test("RepeatingTimer, forever, coalescing: no overlap, barrier, fireCount = runs")
    func repeatingForever() { Self.check(RepeatingTimerSystem<ForeverCoalescing>.self, "RepeatingTimer forever") }

    @Test("RepeatingTimer, 2 repetitions, immediate, catching up: also reaches .finished")
    func repeatingTwice() { Self.check(RepeatingTimerSystem<TwiceImmediately>.self, "RepeatingTimer ×2") }

    @Test("RepeatingTimer, 1 repetition, skipping: also reaches .finished")
    func repeatingOnce() { Self.check(RepeatingTimerSystem<OnceSkipping>.self, "RepeatingTimer ×1") }
}

extension ExplorationTests {
    @Test("DelayedWork: runs at most once, never after cancel() returned true, barrier")
    func delayedWork() { Self.check(DelayedWorkSystem.self, "DelayedWork", extraDepth: 1) }

    @Test("Watchdog: fires at most once, never early, never after invalidate() returned")
    func watchdog() { Self.check(WatchdogSystem.self, "Watchdog") }

    @Test("Debouncer: only the latest call runs, once per quiet period, in call order; no overlap; barrier")
    func debouncer() { Self.check(DebouncerSystem<TrailingOnly>.self, "Debouncer", extraDepth: 1) }

    @Test("Debouncer, leading: a burst's first call runs at once, a flush ends the burst, the latest call runs last")
    func leadingDebouncer() { Self.check(DebouncerSystem<LeadingToo>.self, "Debouncer leading", extraDepth: 1) }

    @Test("Throttler (latest): runs an interval apart, the last call of a burst runs; no overlap; barrier")
    func throttlerLatest() { Self.check(ThrottlerSystem<KeepLatest>.self, "Throttler latest", extraDepth: 2) }

    @Test("Throttler (first): runs an interval apart; no overlap; barrier")
    func throttlerFirst() { Self.check(ThrottlerSystem<KeepFirst>.self, "Throttler first", extraDepth: 2) }
}
