import SafeTimersTesting
import Synchronization
import Testing

@testable import SafeTimers

/// Marble-style scenarios: calls at given virtual times (ms), runs recorded as
/// "value@time".
@Suite("Debouncer and Throttler (virtual time)")
struct RateLimitingTests {
    /// Plays `calls` (time in ms, value) through `send`, then advances far enough
    /// for everything to settle; returns the runs.
    func play(
        _ calls: [(Int, String)], manual: ManualTimerScheduler, until end: Int = 10_000,
        send: (@escaping @Sendable () -> Void) -> Void, between: (Int) -> Void = { _ in }
    ) -> [String] {
        let runs = StateLock<[String]>([])
        for (time, value) in calls {
            manual.advance(to: .milliseconds(time))
            between(time)
            send { runs.withLock { $0.append("\(value)@\(manual.now.milliseconds)") } }
        }
        manual.advance(to: .milliseconds(end))
        return runs.withLock { $0 }
    }

    @Test("debounce: only the last call of a burst runs, delay after it")
    func debounceBurst() {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .milliseconds(300), scheduler: manual)
        let runs = play(
            [(0, "a"), (100, "b"), (250, "c"), (1000, "d"), (1299, "e"), (2000, "f")], manual: manual,
            send: { debouncer.call($0) })
        #expect(runs == ["c@550", "e@1599", "f@2300"])
    }

    @Test("debounce: cancel drops the pending call and releases it")
    func debounceCancel() {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .milliseconds(300), scheduler: manual)
        let released = Counter()
        let ran = Counter()
        do {
            let captured = Tracked { released.increment() }
            debouncer.call {
                captured.touch()
                ran.increment()
            }
        }
        manual.advance(by: .milliseconds(100))
        debouncer.cancel()
        #expect(released.count == 1)
        manual.advance(by: .seconds(1))
        #expect(ran.count == 0)
        #expect(manual.pendingCount == 0)
    }

    @Test("debounce: a replaced call is released at once")
    func debounceReleasesReplaced() {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .milliseconds(300), scheduler: manual)
        let released = Counter()
        do {
            let captured = Tracked { released.increment() }
            debouncer.call { captured.touch() }
        }
        debouncer.call {}
        #expect(released.count == 1)
    }

    @Test("throttle: leading call at once, latest of each window at its end, windows chain")
    func throttleBurst() {
        let manual = ManualTimerScheduler()
        let throttler = Throttler(interval: .seconds(1), scheduler: manual)
        let runs = play(
            [(0, "a"), (100, "b"), (400, "c"), (1500, "d"), (2100, "e"), (5000, "f")], manual: manual,
            send: { action in
                throttler.call(action)
                manual.advance(by: .zero)  // let a leading run happen now
            })
        #expect(runs == ["a@0", "c@1000", "d@2000", "e@3000", "f@5000"])
    }

    @Test("throttle: a lone call runs once, and the window simply closes")
    func throttleSingle() {
        let manual = ManualTimerScheduler()
        let throttler = Throttler(interval: .seconds(1), scheduler: manual)
        let ran = Counter()
        throttler.call { ran.increment() }
        manual.advance(by: .seconds(10))
        #expect(ran.count == 1)
        #expect(manual.pendingCount == 0)
    }

    @Test("throttle: cancel drops the waiting call and closes the window")
    func throttleCancel() {
        let manual = ManualTimerScheduler()
        let throttler = Throttler(interval: .seconds(1), scheduler: manual)
        let runs = StateLock<[String]>([])
        throttler.call { runs.withLock { $0.append("a") } }
        manual.advance(by: .milliseconds(10))
        throttler.call { runs.withLock { $0.append("b") } }
        throttler.cancel()
        manual.advance(by: .seconds(5))
        #expect(runs.withLock { $0 } == ["a"])
        #expect(manual.pendingCount == 0)
        throttler.call { runs.withLock { $0.append("c") } }
        manual.advance(by: .zero)
        #expect(runs.withLock { $0 } == ["a", "c"], "after cancel, the next call opens a new window")
    }

    @Test("throttle: a zero interval runs each call at once, merging only calls made while one is in flight")
    func throttleZero() {
        let manual = ManualTimerScheduler()
        let throttler = Throttler(interval: .zero, scheduler: manual)
        let ran = StateLock<[Int]>([])
        for number in 0..<5 {
            throttler.call { ran.withLock { $0.append(number) } }
            manual.advance(by: .zero)
        }
        #expect(ran.withLock { $0 } == [0, 1, 2, 3, 4])
        for number in 5..<10 { throttler.call { ran.withLock { $0.append(number) } } }
        manual.advance(by: .zero)
        #expect(ran.withLock { $0 } == [0, 1, 2, 3, 4, 5, 9], "the first runs; the latest of the rest runs after it")
    }
}

extension Duration {
    var milliseconds: Int64 {
        components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000
    }
}
