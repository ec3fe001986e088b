import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// `EngineTick`, the repeating entry behind StallDetection's shared heartbeat:
/// its grid, its one start, its cancel, and that a late body skips the grid
/// points it missed instead of firing for each.
@Suite("EngineTick")
struct EngineTickTests {
    @Test("ticks a period after start, on the grid; a second start arms nothing more; after cancel, none")
    func gridStartAndCancel() {
        let manual = ManualTimerScheduler()
        let times = Mutex<[Duration]>([])
        let tick = EngineTick(period: .milliseconds(10), scheduler: manual) {
            times.withLock { $0.append(manual.now) }
        }
        manual.advance(by: .milliseconds(25))
        #expect(times.withLock { $0 }.isEmpty, "not started: no tick")
        tick.start()
        manual.advance(by: .milliseconds(35))
        tick.start()
        manual.advance(by: .milliseconds(10))
        #expect(times.withLock { $0 } == [35, 45, 55, 65].map { .milliseconds($0) })
        #expect(manual.pendingCount == 1)
        tick.cancel()
        manual.advance(by: .milliseconds(100))
        #expect(times.withLock { $0.count } == 4)
        #expect(manual.pendingCount == 0)
        tick.start()
        manual.advance(by: .milliseconds(100))
        #expect(times.withLock { $0.count } == 4, "a cancelled tick does not start again")
    }

    @Test("a period below a microsecond counts as one; a zero or negative one too")
    func tinyPeriods() {
        for period in [Duration.zero, .nanoseconds(-5), .nanoseconds(1)] {
            let manual = ManualTimerScheduler()
            let count = Atomic<Int>(0)
            let tick = EngineTick(period: period, scheduler: manual) { count.add(1, ordering: .relaxed) }
            tick.start()
            manual.advance(by: .microseconds(10))
            #expect(count.load(ordering: .relaxed) == 10, "\(period)")
            tick.cancel()
        }
    }

    @Test("a body that holds the scheduler thread past several points gets one call, not one per point missed")
    func lateBodySkipsMissedPoints() {
        let scheduler = SystemTimerScheduler()
        let period: Int64 = 10_000_000
        let origin = scheduler.engine.nowTicks
        let points = Mutex<[Int64]>([])
        let tick = EngineTick(period: .nanoseconds(period), scheduler: scheduler) {
            let now = scheduler.engine.nowTicks
            let first = points.withLock { points in
                points.append((now - origin) / period)
                return points.count == 1
            }
            // The first call holds the thread for four periods.
            if first { usleep(40_000) }
        }
        tick.start()
        let deadline = ContinuousClock.now + .seconds(10)
        while points.withLock({ $0.count }) < 6 && ContinuousClock.now < deadline { usleep(5_000) }
        tick.cancel()
        let seen = points.withLock { $0 }
        #expect(seen.count >= 6, "\(seen)")
        // Each call is for a later grid point than the one before: the points the
        // first call held up are skipped, none fires twice (a machine that runs
        // the thread late may skip more).
        #expect(zip(seen, seen.dropFirst()).allSatisfy { $0 < $1 }, "\(seen)")
        #expect(
            seen.count < 2 || seen[1] - seen[0] >= 4, "the second call comes after the first's four periods: \(seen)")
    }
}
