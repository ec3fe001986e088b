import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// pendingCount after primitives ran, were cancelled or are due together, under real and virtual time.
@Suite("pendingCount counts what users armed, and nothing else")
struct PendingCountTests {
    @Test("pendingCount reads 0 once works due together on a serial queue have all run (private system scheduler)")
    func pendingCountAfterSerialQueueBatch() {
        var failures = 0
        for _ in 0..<20 {
            let scheduler = SystemTimerScheduler()
            let queue = DispatchQueue(label: "attack.serial")
            let done = DispatchSemaphore(value: 0)
            let ran = Atomic<Int>(0)
            let total = 64
            for _ in 0..<total {
                _ = DelayedWork.schedule(after: .milliseconds(2), on: queue, scheduler: scheduler) {
                    if ran.add(1, ordering: .relaxed).newValue == total { done.signal() }
                }
            }
            done.wait()
            queue.sync {}
            if scheduler.pendingCount != 0 { failures += 1 }
        }
        #expect(failures == 0)
    }

    @Test("pendingCount of a manual scheduler follows Watchdogs, Debouncers, Throttlers and RepeatingTimers")
    func pendingCountOfEveryPrimitive() {
        let manual = ManualTimerScheduler()
        let dog = Watchdog(timeout: .seconds(5), scheduler: manual) {}
        #expect(manual.pendingCount == 1)
        #expect(dog.kick())
        manual.advance(by: .seconds(3))
        #expect(dog.kick())
        #expect(manual.pendingCount == 1)
        manual.advance(by: .seconds(10))
        #expect(dog.hasFired)
        #expect(manual.pendingCount == 0)

        let debouncer = Debouncer(delay: .seconds(1), queue: .global(), scheduler: manual)
        debouncer.call {}
        debouncer.call {}
        #expect(manual.pendingCount == 1)
        debouncer.flush()
        manual.advance(by: .zero)
        #expect(manual.pendingCount == 0)
        debouncer.call {}
        debouncer.cancel()
        #expect(manual.pendingCount == 0)

        let throttler = Throttler(interval: .seconds(1), scheduler: manual)
        throttler.call {}
        throttler.call {}
        manual.advance(by: .seconds(5))
        manual.runUntilIdle()
        #expect(manual.pendingCount == 0)

        let timer = RepeatingTimer(interval: .seconds(1), repetitions: 3, scheduler: manual) {}
        timer.start()
        #expect(manual.pendingCount == 1)
        manual.advance(by: .seconds(10))
        #expect(timer.fireCount == 3)
        #expect(manual.pendingCount == 0)
        let forever = RepeatingTimer(interval: .seconds(1), scheduler: manual) {}
        forever.start()
        forever.suspend()
        #expect(manual.pendingCount == 0)
        forever.resume()
        #expect(manual.pendingCount == 1)
        forever.cancel()
        #expect(manual.pendingCount == 0)
    }

    @Test("pendingCount of a private system scheduler reads 0 after each primitive has run")
    func pendingCountAfterRealTimeRuns() async throws {
        let scheduler = SystemTimerScheduler()
        var readings: [String: Int] = [:]

        let dogRan = DispatchSemaphore(value: 0)
        let dog = Watchdog(timeout: .milliseconds(1), scheduler: scheduler) { dogRan.signal() }
        dogRan.wait()
        readings["watchdog"] = scheduler.pendingCount
        _ = dog

        let debounced = DispatchSemaphore(value: 0)
        let debouncer = Debouncer(delay: .milliseconds(1), scheduler: scheduler)
        debouncer.call {}
        debouncer.call { debounced.signal() }
        debounced.wait()
        usleep(1_000)
        readings["debouncer"] = scheduler.pendingCount

        let throttled = DispatchSemaphore(value: 0)
        let throttler = Throttler(interval: .milliseconds(1), scheduler: scheduler)
        throttler.call {}
        throttler.call { throttled.signal() }
        throttled.wait()
        usleep(5_000)
        readings["throttler"] = scheduler.pendingCount

        let ticked = Atomic<Int>(0)
        let timer = RepeatingTimer(interval: .milliseconds(1), repetitions: 3, scheduler: scheduler) {
            ticked.add(1, ordering: .relaxed)
        }
        timer.start()
        while timer.state != .finished { usleep(200) }
        readings["timer"] = scheduler.pendingCount

        try await scheduler.clock.sleep(for: .milliseconds(1))
        readings["sleep"] = scheduler.pendingCount
        try? await scheduler.clock.sleep(until: scheduler.clock.now)
        readings["sleep-now"] = scheduler.pendingCount
        #expect(readings == ["watchdog": 0, "debouncer": 0, "throttler": 0, "timer": 0, "sleep": 0, "sleep-now": 0])
    }
}
