import Dispatch
import SafeTimersTesting
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// Every primitive's `scheduler:` defaults to `nil`, which is the shared system
/// scheduler: one rule for all of them, documented on each parameter.
@Suite("Default scheduler")
struct DefaultSchedulerTests {
    @Test("nil is the shared scheduler's engine; any other scheduler is its own")
    func engineOfNil() {
        let manual = ManualTimerScheduler()
        let own = SystemTimerScheduler()
        #expect(TimerEngine.of(nil) === SystemTimerScheduler.shared.engine)
        #expect(TimerEngine.of(manual) === manual.engine)
        #expect(TimerEngine.of(own) === own.engine)
        #expect(TimerEngine.of(SystemTimerScheduler.shared) === TimerEngine.of(nil))
    }

    @Test("each primitive given scheduler: nil runs on real time, as when scheduler: is left out")
    func primitivesAcceptNil() async throws {
        let ran = Counter()
        let debouncer = Debouncer(delay: .milliseconds(1), scheduler: nil)
        let throttler = Throttler(interval: .milliseconds(1), scheduler: nil)
        let timer = RepeatingTimer(interval: .milliseconds(1), repetitions: 1, scheduler: nil) { ran.increment() }
        let work = DelayedWork.schedule(after: .milliseconds(1), scheduler: nil) { ran.increment() }
        let watchdog = Watchdog(timeout: .milliseconds(1), scheduler: nil) { ran.increment() }
        debouncer.call { ran.increment() }
        throttler.call { ran.increment() }
        timer.start()
        #expect(await eventually { ran.count == 5 }, "\(ran.count) of 5 ran")
        let value = try await withTimeout(.seconds(20), scheduler: nil) { 42 }
        #expect(value == 42)
        _ = (work, watchdog)
    }
}
