import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// Primitives keep their scheduler's engine; a released real-time engine fires what is armed and then
/// ends its thread; a dropped manual scheduler releases what was armed on it.
@Suite("A released scheduler drops nothing, and its thread ends once nothing is armed")
struct ReleasedSchedulerTests {
    @Test("primitives on a released SystemTimerScheduler() still fire")
    func releasedSchedulerKeepsWorking() {
        let fired = Counter()
        let dog = Watchdog(timeout: .milliseconds(20), scheduler: SystemTimerScheduler()) { fired.increment() }
        let work = DelayedWork.schedule(after: .milliseconds(20), scheduler: SystemTimerScheduler()) {
            fired.increment()
        }
        let timer = RepeatingTimer(interval: .milliseconds(10), scheduler: SystemTimerScheduler()) {
            fired.increment()
        }
        timer.start()
        waitUntil { dog.hasFired && work.state == .completed && timer.fireCount >= 3 }
        #expect(dog.hasFired)
        #expect(work.state == .completed)
        #expect(timer.fireCount >= 3)
        timer.cancel()
    }

    @Test("a retired scheduler's thread ends once nothing is armed, and the engine is freed")
    func retiredEngineEnds() {
        weak var engine: TimerEngine?
        do {
            let scheduler = SystemTimerScheduler()
            engine = scheduler.engine
            let work = DelayedWork.schedule(after: .milliseconds(5), scheduler: scheduler) {}
            waitUntil { work.state == .completed }
        }
        waitUntil { engine == nil }
        #expect(engine == nil, "the engine (and its thread) outlived every use")
    }

    @Test("a released scheduler with never-due work armed: its thread sleeps (no look once a second)")
    func retiredEngineWithNeverDueWorkSleeps() {
        weak var engine: TimerEngine?
        var work: DelayedWork?
        do {
            let scheduler = SystemTimerScheduler()
            engine = scheduler.engine
            work = DelayedWork.schedule(after: .seconds(Int64.max), scheduler: scheduler) {}
            waitUntil { scheduler.engine.schedulerThreadID != 0 }
        }
        // Released; the pending work keeps the engine and its thread.
        usleep(100_000)
        let before = engine?.wakeUpCount ?? -1
        usleep(2_500_000)
        #expect(engine?.wakeUpCount == before, "woke \((engine?.wakeUpCount ?? 0) - before) times in 2.5 s")
        // The cancel that empties it ends the thread at once; then the engine is freed.
        let cancelled = Date()
        #expect(work?.cancel() == true)
        work = nil
        waitUntil { engine == nil }
        #expect(engine == nil)
        #expect(
            Date().timeIntervalSince(cancelled) < 0.9, "ended \(Date().timeIntervalSince(cancelled)) s after the cancel"
        )
    }

    #if DEBUG
    @Test("the release and the last cancel land while the scheduler thread is about to sleep: it still ends")
    func retireAndEmptyBeforeSleeping() {
        /// The one strong reference to a scheduler, dropped by the test.
        final class Holder: @unchecked Sendable {
            // Written by the test thread only.
            var scheduler: SystemTimerScheduler? = SystemTimerScheduler()
        }
        let holder = Holder()
        let engine = holder.scheduler!.engine
        weak let weakEngine = engine
        let atWindow = DispatchSemaphore(value: 0)
        let proceed = DispatchSemaphore(value: 0)
        let paused = StateLock(false)
        engine.beforeSleepingForTesting.withLock { hook in
            hook = {
                // The first time only: the thread holds here until the test has
                // released the scheduler and cancelled the work.
                guard
                    paused.withLock({ done in
                        defer { done = true }; return !done
                    })
                else { return }
                atWindow.signal()
                proceed.wait()
            }
        }
        var work: DelayedWork? = DelayedWork.schedule(after: .seconds(3_600), scheduler: holder.scheduler) {}
        #expect(atWindow.wait(timeout: .now() + 20) == .success)
        holder.scheduler = nil  // retire: its signal finds no sleeper
        #expect(work?.cancel() == true)  // empties it: its signal finds no sleeper either
        work = nil  // (a primitive keeps its engine)
        proceed.signal()
        _ = consume engine
        waitUntil { weakEngine == nil }
        #expect(weakEngine == nil, "the thread slept on past the release and the last cancel")
    }
    #endif

    @Test(
        "released schedulers whose timers re-arm from the fire path (1 ms ticks, 5 each, 40 at once): all tick, all end"
    )
    func retiredEnginesReArmingFromTheirOwnThread() {
        let ticks = Counter()
        var timers: [RepeatingTimer] = []
        var engines: [() -> TimerEngine?] = []
        for _ in 0..<40 {
            let scheduler = SystemTimerScheduler()
            weak let engine = scheduler.engine
            engines.append { engine }
            let timer = RepeatingTimer(interval: .milliseconds(1), repetitions: 5, scheduler: scheduler) {
                ticks.increment()
            }
            timer.start()
            timers.append(timer)
            // The scheduler is released here; its thread keeps firing and re-arming.
        }
        waitUntil { timers.allSatisfy { $0.state == .finished } }
        #expect(ticks.count == 200)
        timers = []
        waitUntil { engines.allSatisfy { $0() == nil } }
        #expect(engines.filter { $0() != nil }.isEmpty, "a retired engine outlived its last timer")
    }

    @Test("a pending DelayedWork whose handle and ManualTimerScheduler are dropped releases its captures")
    func droppedManualSchedulerReleases() {
        let released = Counter()
        do {
            let manual = ManualTimerScheduler()
            let captured = Tracked { released.increment() }
            _ = DelayedWork.schedule(after: .seconds(10), scheduler: manual) { captured.touch() }
            let timer = RepeatingTimer(interval: .seconds(1), scheduler: manual) { captured.touch() }
            timer.start()
        }
        #expect(released.count == 1)
    }

    @Test("a handle kept after its manual scheduler is gone stays pending and can still be cancelled")
    func handleOutlivesManualScheduler() {
        var work: DelayedWork?
        do {
            let manual = ManualTimerScheduler()
            work = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {}
        }
        #expect(work?.state == .pending)
        #expect(work?.cancel() == true)
        #expect(work?.state == .cancelled)
    }
}
