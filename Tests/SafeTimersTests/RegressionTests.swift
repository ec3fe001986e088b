import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// One test per defect found by hostile use of the first version (each failed
/// on that version). Real-time tests use generous bounds and assert outcomes,
/// never speed.
@Suite("Regressions")
struct RegressionTests {
    /// Counts handler invocations in flight and remembers the most at once.
    final class Overlap: Sendable {
        private let state = StateLock((current: 0, most: 0, finished: 0))
        func enter() {
            state.withLock {
                $0.current += 1; $0.most = max($0.most, $0.current)
            }
        }
        func leave() {
            state.withLock {
                $0.current -= 1; $0.finished += 1
            }
        }
        var current: Int { state.withLock { $0.current } }
        var most: Int { state.withLock { $0.most } }
        var finished: Int { state.withLock { $0.finished } }
    }

    // MARK: 1. Overlap after suspend()+resume() from another thread, and cancel() then no barrier

    @Test("1. suspend(); resume() from another thread while the handler runs: no second invocation beside it")
    func suspendResumeDoesNotOverlap() async {
        let overlap = Overlap()
        let began = Counter()
        let scheduler = SystemTimerScheduler()
        let timer = RepeatingTimer(interval: .milliseconds(1), scheduler: scheduler) {
            overlap.enter()
            began.increment()
            if began.count == 1 { usleep(150_000) }
            overlap.leave()
        }
        timer.start()
        await eventually { began.count >= 1 }
        timer.suspend()
        timer.resume()
        try? await Task.sleep(for: .milliseconds(50))  // the old design began a second invocation about 1 ms later
        #expect(overlap.most == 1, "two invocations ran at once")
        await eventually { overlap.finished >= 1 }
        timer.cancel()
        #expect(overlap.current == 0, "cancel() returned while a handler still ran")
        let after = began.count
        try? await Task.sleep(for: .milliseconds(20))
        #expect(began.count == after, "a handler began after cancel() returned")
        withExtendedLifetime(scheduler) {}
    }

    @Test("1. cancel(); start() from inside the handler (real time): the next invocation waits for this one")
    func cancelStartInsideHandlerRealTime() async {
        let overlap = Overlap()
        let began = Counter()
        let box = StateLock<RepeatingTimer?>(nil)
        let scheduler = SystemTimerScheduler()
        let timer = RepeatingTimer(interval: .milliseconds(1), scheduler: scheduler) {
            overlap.enter()
            began.increment()
            if began.count == 1, let timer = box.withLock({ $0 }) {
                timer.cancel()
                timer.start()
                usleep(100_000)
            }
            overlap.leave()
        }
        box.withLock { $0 = timer }
        timer.start()
        await eventually { began.count >= 3 }
        timer.cancel()
        box.withLock { $0 = nil }
        #expect(overlap.most == 1, "\(overlap.most) invocations ran at once")
        #expect(overlap.current == 0)
        withExtendedLifetime(scheduler) {}
    }

    @Test("1. cancel(); start() from inside the handler (virtual time): no re-entrant invocation")
    func cancelStartInsideHandlerVirtual() {
        let manual = ManualTimerScheduler()
        let overlap = Overlap()
        let box = StateLock<RepeatingTimer?>(nil)
        let restarted = Flag()
        let timer = RepeatingTimer(interval: .seconds(1), firesImmediately: true, scheduler: manual) {
            overlap.enter()
            if !restarted.isSet, let timer = box.withLock({ $0 }) {
                restarted.set()
                timer.cancel()
                timer.start()
            }
            overlap.leave()
        }
        box.withLock { $0 = timer }
        timer.start()
        manual.advance(by: .seconds(3))
        #expect(overlap.most == 1)
        #expect(timer.fireCount == 4, "restart, immediate tick, then ticks at 1, 2 and 3 s")
        box.withLock { $0 = nil }
    }

    // MARK: 2. Debouncer.cancel() is a barrier

    @Test("2. Debouncer.cancel() waits for an action running on another thread")
    func debouncerCancelIsABarrier() async {
        let debouncer = Debouncer(delay: .zero)
        let overlap = Overlap()
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

    // MARK: 3. Throttler runs at least one interval apart at window edges

    @Test("3. Throttler: a call at a window's edge from another timer, then one within: runs 1 s apart")
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

    @Test("3. Throttler fed from timers on a 100 ms grid, interval 300 ms: every run at least 300 ms after the last")
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

    // MARK: 4. A released private scheduler drops nothing

    @Test("4. primitives on a released SystemTimerScheduler() still fire")
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

    @Test("4. a retired scheduler's thread ends once nothing is armed, and the engine is freed")
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

    @Test("4b. a released scheduler with never-due work armed: its thread sleeps (no look once a second)")
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

    @Test("4c. the release and the last cancel land while the scheduler thread is about to sleep: it still ends")
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

    @Test(
        "4d. released schedulers whose timers re-arm from the fire path (1 ms ticks, 5 each, 40 at once): all tick, all end"
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

    // MARK: 5. Durations of any magnitude

    @Test("5. huge and huge-negative durations never trap; each has its documented outcome")
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

    // MARK: 6. repetitions with suspend/resume in the handler

    @Test("6. repetitions: 1 and suspend(); resume() inside the handler: finished, nothing pending, ticks end")
    func repetitionsFinishAfterSuspendResume() async {
        let manual = ManualTimerScheduler()
        let box = StateLock<RepeatingTimer?>(nil)
        let timer = RepeatingTimer(interval: .seconds(1), repetitions: 1, scheduler: manual) {
            let timer = box.withLock { $0 }
            timer?.suspend()
            timer?.resume()
        }
        box.withLock { $0 = timer }
        let ticks = timer.ticks
        timer.start()
        manual.advance(by: .seconds(60))
        #expect(timer.state == .finished)
        #expect(timer.fireCount == 1)
        #expect(manual.pendingCount == 0)
        var numbers: [Int] = []
        for await tick in ticks { numbers.append(tick.number) }  // must end
        #expect(numbers == [1])
        box.withLock { $0 = nil }
    }

    // MARK: 7. Catch-up is iterative

    @Test("7. catchUp(limit: 10_000) whose handler advances the clock: owed ticks run iteratively, no stack overflow")
    func catchUpIsIterative() {
        let manual = ManualTimerScheduler()
        let depth = Overlap()
        let advanced = Flag()
        let timer = RepeatingTimer(interval: .milliseconds(1), missedTicks: .catchUp(limit: 10_000), scheduler: manual)
        {
            depth.enter()
            if !advanced.isSet {
                advanced.set()
                manual.advance(by: .seconds(10))
            }
            depth.leave()
        }
        timer.start()
        manual.advance(by: .milliseconds(1))
        #expect(timer.fireCount == 10_001, "the first tick, then 10,000 owed (the limit)")
        #expect(depth.most == 1, "an invocation began inside another")
        timer.cancel()
    }

    // MARK: 8. Dropping a manual scheduler releases what is armed on it

    @Test("8. a pending DelayedWork whose handle and ManualTimerScheduler are dropped releases its captures")
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

    @Test("8. a handle kept after its manual scheduler is gone stays pending and can still be cancelled")
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

    // MARK: 9. Owner-bound timers count only invocations that ran

    @Test("9. the invocation that finds the owner gone adds nothing to fireCount and yields no tick")
    func ownerGoneIsNotCounted() async {
        final class Owner: Sendable {}
        let manual = ManualTimerScheduler()
        var owner: Owner? = Owner()
        let ran = Counter()
        let timer = RepeatingTimer(interval: .seconds(1), owner: owner!, scheduler: manual) { _ in ran.increment() }
        let ticks = timer.ticks
        timer.start()
        manual.advance(by: .seconds(1))
        owner = nil
        manual.advance(by: .seconds(5))
        #expect(timer.state == .cancelled)
        #expect(timer.fireCount == 1)
        #expect(ran.count == 1)
        var numbers: [Int] = []
        for await tick in ticks { numbers.append(tick.number) }
        #expect(numbers == [1])
        #expect(manual.pendingCount == 0)
    }

    // MARK: Also reported

    @Test("leeway is clamped to half the interval, so a huge leeway still ticks (real time)")
    func leewayClamped() {
        let ticks = Counter()
        let timer = RepeatingTimer(interval: .milliseconds(10), leeway: .seconds(Int64.max)) { ticks.increment() }
        timer.start()
        waitUntil { ticks.count >= 3 }
        #expect(ticks.count >= 3)
        timer.cancel()
    }

    @Test("under a manual scheduler no handler runs outside advance")
    func nothingRunsOutsideAdvance() {
        let manual = ManualTimerScheduler()
        let ran = Counter()
        let work = DelayedWork.schedule(after: .zero, scheduler: manual) { ran.increment() }
        let throttler = Throttler(interval: .seconds(1), scheduler: manual)
        throttler.call { ran.increment() }
        let debouncer = Debouncer(delay: .seconds(1), scheduler: manual)
        debouncer.call { ran.increment() }
        debouncer.flush()
        let dog = Watchdog(timeout: .zero, scheduler: manual) { ran.increment() }
        let timer = RepeatingTimer(interval: .seconds(1), firesImmediately: true, scheduler: manual) { ran.increment() }
        timer.start()
        #expect(ran.count == 0)
        manual.advance(by: .zero)
        #expect(ran.count == 5)
        #expect(work.state == .completed)
        #expect(dog.hasFired)
        timer.cancel()
    }
}
