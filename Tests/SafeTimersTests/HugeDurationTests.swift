import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// Huge, huge-negative and saturating durations and instants: each has its documented outcome.
@Suite("Durations and instants of any magnitude never trap")
struct HugeDurationTests {
    @Test("huge and huge-negative durations never trap; each has its documented outcome")
    func hugeDurations() async throws {
        let manual = ManualTimerScheduler()
        let ran = Counter()
        let far = DelayedWork.schedule(after: .seconds(1e20), scheduler: manual) { ran.increment() }
        let dog = Watchdog(timeout: Duration(secondsComponent: .max, attosecondsComponent: .max), scheduler: manual) {
            ran.increment()
        }
        let debouncer = Debouncer(delay: .seconds(-1e20), scheduler: manual)
        debouncer.call { ran.increment() }
        manual.advance(by: .seconds(Int64.max) * 2)
        manual.advance(by: .seconds(-1e20))
        manual.advance(to: .seconds(1e20))
        #expect(far.state == .pending, "too long to represent: never")
        #expect(!dog.hasFired)
        #expect(ran.count == 1, "the debounced call (negative delay) ran as soon as possible")
        let value = try await withTimeout(.seconds(1e20), scheduler: manual) { 7 }
        #expect(value == 7)
        let timer = RepeatingTimer(interval: .seconds(1e20), leeway: .seconds(-1e20), scheduler: manual) {}
        timer.start()
        #expect(timer.interval == .nanoseconds(Int64.max))
        #expect(DeadlineArithmetic.nanoseconds(.seconds(1e20)) == Int64.max)
        #expect(DeadlineArithmetic.nanoseconds(.seconds(-1e20)) == Int64.min)
        #expect(DeadlineArithmetic.nanoseconds(Duration(secondsComponent: .min, attosecondsComponent: -1)) == Int64.min)
        #expect(DeadlineArithmetic.nanoseconds(.nanoseconds(Int64.max)) == Int64.max)
        #expect(DeadlineArithmetic.nanoseconds(.seconds(1.5)) == 1_500_000_000)
        #expect(DeadlineArithmetic.nanoseconds(.nanoseconds(-3)) == -3)
        timer.cancel()
        far.cancel()
    }

    @Test("instant minus a duration of any magnitude saturates instead of trapping")
    func instantMinusSaturates() {
        let manual = ManualTimerScheduler()
        let now = manual.clock.now
        #expect((now - Duration(attoseconds: Int128.min + 1)).sinceCreation == .nanoseconds(Int64.max))
        #expect((now - Duration(attoseconds: Int128.min)).sinceCreation == .nanoseconds(Int64.max))
        #expect((now - Duration(attoseconds: Int128.max)).sinceCreation == .nanoseconds(-Int64.max))
        #expect((now - .seconds(2)).sinceCreation == .seconds(-2))
    }

    @Test("at the end of time, zero-delay work and zero sleeps still run")
    func endOfTime() async throws {
        let manual = ManualTimerScheduler()
        manual.advance(by: .seconds(Int64.max))
        let ran = Counter()
        let work = DelayedWork.schedule(after: .zero, scheduler: manual) { ran.increment() }
        manual.advance(by: .seconds(1))
        #expect(work.state == .completed)
        let task = Task { try await manual.clock.sleep(for: .zero) }
        await manual.waitForSleepers(1)
        manual.advance(by: .zero)
        try await task.value
    }
}
