import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// A debouncer's cancel is a barrier; a throttler's runs begin at least one interval apart at window edges.
@Suite("Debouncer and Throttler: cancel waits for a running action; runs an interval apart")
struct RateLimitingBarrierTests {
    @Test("Debouncer.cancel() waits for an action running on another thread")
    func debouncerCancelIsABarrier() async {
        let debouncer = Debouncer(delay: .zero)
        let overlap = InvocationOverlap()
        debouncer.call {
            overlap.enter()
            usleep(150_000)
            overlap.leave()
        }
        await eventually { overlap.current == 1 }
        debouncer.call {}
        debouncer.cancel()
        #expect(overlap.current == 0, "cancel() returned while the action still ran")
        #expect(overlap.finished == 1)
    }

    @Test("Throttler: a call at a window's edge from another timer, then one within: runs 1 s apart")
    func throttlerWindowEdge() {
        let manual = ManualTimerScheduler()
        let throttler = Throttler(interval: .seconds(1), scheduler: manual)
        let runs = StateLock<[Duration]>([])
        let record: @Sendable () -> Void = { runs.withLock { $0.append(manual.now) } }
        // Armed before the throttler's own window end, so it fires first at 1 s.
        let edge = DelayedWork.schedule(after: .seconds(1), scheduler: manual) { throttler.call(record) }
        throttler.call(record)
        manual.advance(by: .milliseconds(1500))
        throttler.call(record)
        manual.advance(by: .seconds(5))
        #expect(runs.withLock { $0 } == [.zero, .seconds(1), .seconds(2)])
        _ = edge
    }

    @Test("Throttler fed from timers on a 100 ms grid, interval 300 ms: every run at least 300 ms after the last")
    func throttlerGrid() {
        let manual = ManualTimerScheduler()
        let throttler = Throttler(interval: .milliseconds(300), scheduler: manual)
        let runs = StateLock<[Duration]>([])
        let feeders = (0..<4).map { _ in
            RepeatingTimer(interval: .milliseconds(100), scheduler: manual) {
                throttler.call { runs.withLock { $0.append(manual.now) } }
            }
        }
        for feeder in feeders { feeder.start() }
        manual.advance(by: .seconds(10))
        let times = runs.withLock { $0 }
        #expect(times.count >= 30)
        for (earlier, later) in zip(times, times.dropFirst()) {
            #expect(later - earlier >= .milliseconds(300), "runs at \(earlier) and \(later)")
        }
        for feeder in feeders { feeder.cancel() }
    }
}
