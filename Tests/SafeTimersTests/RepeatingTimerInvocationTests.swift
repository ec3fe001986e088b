import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// Suspend, resume, cancel and restart from inside and outside the handler never let two invocations
/// overlap; repetitions finish, catch-up is iterative, and an invocation that finds its owner gone
/// counts nothing.
@Suite("RepeatingTimer: one invocation at a time, repetitions, catch-up and owners")
struct RepeatingTimerInvocationTests {
    @Test("suspend(); resume() from another thread while the handler runs: no second invocation beside it")
    func suspendResumeDoesNotInvocationOverlap() async {
        let overlap = InvocationOverlap()
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

    @Test("cancel(); start() from inside the handler (real time): the next invocation waits for this one")
    func cancelStartInsideHandlerRealTime() async {
        let overlap = InvocationOverlap()
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

    @Test("cancel(); start() from inside the handler (virtual time): no re-entrant invocation")
    func cancelStartInsideHandlerVirtual() {
        let manual = ManualTimerScheduler()
        let overlap = InvocationOverlap()
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

    @Test("repetitions: 1 and suspend(); resume() inside the handler: finished, nothing pending, ticks end")
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

    @Test("catchUp(limit: 10_000) whose handler advances the clock: owed ticks run iteratively, no stack overflow")
    func catchUpIsIterative() {
        let manual = ManualTimerScheduler()
        let depth = InvocationOverlap()
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

    @Test("the invocation that finds the owner gone adds nothing to fireCount and yields no tick")
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

    @Test("leeway is clamped to half the interval, so a huge leeway still ticks (real time)")
    func leewayClamped() {
        let ticks = Counter()
        let timer = RepeatingTimer(interval: .milliseconds(10), leeway: .seconds(Int64.max)) { ticks.increment() }
        timer.start()
        waitUntil { ticks.count >= 3 }
        #expect(ticks.count >= 3)
        timer.cancel()
    }

    @Test("a released RepeatingTimer frees its handler's captures although a delivery still waits")
    func releasedTimerWithQueuedDeliveryFreesHandler() {
        let manual = ManualTimerScheduler()
        let released = Counter()
        do {
            let captured = Tracked { released.increment() }
            let timer = RepeatingTimer(interval: .seconds(1), firesImmediately: true, scheduler: manual) {
                captured.touch()
            }
            timer.start()
        }
        #expect(released.count == 1, "the captures waited for the next advance")
        manual.advance(by: .seconds(2))
    }
}
