import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// An entry that re-arms itself every `interval` ticks, like a repeating timer.
final class SelfRearmingEntry: TimerEntry, @unchecked Sendable {
    let interval: Int64
    let fired = Atomic<Int>(0)
    init(interval: Int64) { self.interval = interval }
    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        fired.add(1, ordering: .relaxed)
        engine.arm(self, at: deadline + interval)
    }
}

/// An entry that calls a closure when it fires.
final class ClosureEntry: TimerEntry, @unchecked Sendable {
    let action: @Sendable (Int64, TimerEngine) -> Void
    init(_ action: @escaping @Sendable (Int64, TimerEngine) -> Void) { self.action = action }
    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) { action(deadline, engine) }
}

@Suite("ManualTimerScheduler")
struct ManualTimerSchedulerTests {
    @Test("an hour of a 30 s entry fires exactly 120 times, instantly")
    func anHourOfThirtySeconds() {
        let manual = ManualTimerScheduler()
        let entry = SelfRearmingEntry(interval: 30_000_000_000)
        manual.engine.arm(entry, at: 30_000_000_000)
        let clock = ContinuousClock()
        let elapsed = clock.measure { manual.advance(by: .seconds(3600)) }
        #expect(entry.fired.load(ordering: .relaxed) == 120)
        #expect(manual.now == .seconds(3600))
        #expect(elapsed < .seconds(1))
        #expect(manual.pendingCount == 1)
    }

    @Test("entries fire in deadline order, ties in arming order, with the clock at each deadline")
    func order() {
        let manual = ManualTimerScheduler()
        let log = StateLock<[String]>([])
        func entry(_ name: String) -> ClosureEntry {
            ClosureEntry { deadline, engine in
                log.withLock { $0.append("\(name)@\(deadline / 1_000_000)ms now=\(engine.now)") }
            }
        }
        let a = entry("a")
        let b = entry("b")
        let c = entry("c")
        let d = entry("d")
        manual.engine.arm(c, at: 30_000_000)
        manual.engine.arm(a, at: 10_000_000)
        manual.engine.arm(b, at: 10_000_000)
        manual.engine.arm(d, at: 50_000_000)
        manual.advance(by: .milliseconds(30))
        #expect(
            log.withLock { $0 } == [
                "a@10ms now=0.01 seconds", "b@10ms now=0.01 seconds", "c@30ms now=0.03 seconds",
            ])
        #expect(manual.now == .milliseconds(30))
        #expect(manual.pendingCount == 1)
    }

    @Test("entries armed by a handler during an advance fire within it when due")
    func armingDuringAdvance() {
        let manual = ManualTimerScheduler()
        let log = StateLock<[String]>([])
        let inner = ClosureEntry { deadline, _ in log.withLock { $0.append("inner@\(deadline)") } }
        let tooLate = ClosureEntry { deadline, _ in log.withLock { $0.append("late@\(deadline)") } }
        let outer = ClosureEntry { deadline, engine in
            log.withLock { $0.append("outer@\(deadline)") }
            engine.arm(inner, at: deadline + 5)
            engine.arm(tooLate, at: deadline + 500)
        }
        manual.engine.arm(outer, at: 10)
        manual.advance(by: .nanoseconds(100))
        #expect(log.withLock { $0 } == ["outer@10", "inner@15"])
        #expect(manual.pendingCount == 1)
        manual.advance(by: .nanoseconds(410))
        #expect(log.withLock { $0 } == ["outer@10", "inner@15", "late@510"])
    }

    @Test("zero and negative advances fire only what is due and never move the clock back")
    func nonPositiveAdvance() {
        let manual = ManualTimerScheduler()
        let fired = Atomic<Int>(0)
        let now = ClosureEntry { _, _ in fired.add(1, ordering: .relaxed) }
        manual.advance(by: .seconds(5))
        manual.engine.arm(now, at: manual.engine.nowTicks)
        manual.advance(by: .seconds(-10))
        #expect(fired.load(ordering: .relaxed) == 1)
        #expect(manual.now == .seconds(5))
        manual.advance(by: .zero)
        #expect(manual.now == .seconds(5))
        manual.advance(to: .seconds(1))
        #expect(manual.now == .seconds(5))
    }

    @Test("an overflowing advance goes to the end of time but 'never' entries stay pending")
    func overflowingAdvance() {
        let manual = ManualTimerScheduler()
        let fired = Atomic<Int>(0)
        let far = ClosureEntry { _, _ in fired.add(1, ordering: .relaxed) }
        let never = ClosureEntry { _, _ in Issue.record("never fired") }
        manual.engine.arm(far, at: 1_000_000_000_000_000)
        manual.engine.arm(never, at: Int64.max)
        manual.advance(by: .seconds(Int64.max))
        manual.advance(by: .seconds(Int64.max))
        #expect(fired.load(ordering: .relaxed) == 1)
        #expect(manual.pendingCount == 1)
        #expect(manual.runUntilIdle() == 0)
    }

    @Test("runUntilIdle drains pending work round by round and respects its limit")
    func runUntilIdle() {
        let manual = ManualTimerScheduler()
        let repeating = SelfRearmingEntry(interval: 1_000)
        manual.engine.arm(repeating, at: 1_000)
        #expect(manual.runUntilIdle(limit: 25) == 25)
        #expect(repeating.fired.load(ordering: .relaxed) == 25)
        #expect(manual.engine.disarm(repeating))
        #expect(manual.runUntilIdle() == 0)
    }

    @Test("other threads may arm and cancel while one thread advances")
    func concurrentArming() async {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        let perThread = 2_000
        await withTaskGroup(of: Void.self) { group in
            for lane in 0..<4 {
                group.addTask {
                    for number in 0..<perThread {
                        let entry = ClosureEntry { _, _ in fired.increment() }
                        manual.engine.arm(entry, at: Int64(number % 50))
                        if (number + lane) % 3 == 0 { manual.engine.disarm(entry) }
                    }
                }
            }
            group.addTask {
                for _ in 0..<200 { manual.advance(by: .nanoseconds(1)) }
            }
        }
        manual.advance(by: .seconds(1))
        #expect(manual.pendingCount == 0)
        #expect(fired.count > 0)
    }
}

final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    func increment() { value.add(1, ordering: .relaxed) }
    var count: Int { value.load(ordering: .relaxed) }
}
