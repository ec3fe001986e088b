import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// One test per break found by attacking the invocation gate.
@Suite("Regressions: the invocation gate")
struct InvocationGateRegressionTests {
    @Test("two handlers that cancel each other's timer do not deadlock; each timer stops")
    func crossCancelDoesNotDeadlock() {
        let a = StateLock<RepeatingTimer?>(nil)
        let b = StateLock<RepeatingTimer?>(nil)
        let inA = DispatchSemaphore(value: 0)
        let inB = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let scheduler = SystemTimerScheduler()
        let timerA = RepeatingTimer(
            interval: .milliseconds(10), firesImmediately: true, queue: DispatchQueue(label: "A"), scheduler: scheduler
        ) {
            inA.signal()
            inB.wait()
            b.withLock { $0 }?.cancel()
            done.signal()
        }
        let timerB = RepeatingTimer(
            interval: .milliseconds(10), firesImmediately: true, queue: DispatchQueue(label: "B"), scheduler: scheduler
        ) {
            inB.signal()
            inA.wait()
            a.withLock { $0 }?.cancel()
            done.signal()
        }
        a.withLock { $0 = timerA }
        b.withLock { $0 = timerB }
        timerA.start()
        timerB.start()
        let first = done.wait(timeout: .now() + 20)
        let second = done.wait(timeout: .now() + 20)
        #expect(first == .success && second == .success, "two handlers cancelling each other's timer deadlocked")
        #expect(timerA.state == .cancelled && timerB.state == .cancelled)
        a.withLock { $0 = nil }
        b.withLock { $0 = nil }
    }

    @Test("flush() then call(): the flushed action still runs, then the new one after its quiet period")
    func flushThenCall() {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .seconds(1), scheduler: manual)
        let ran = StateLock<[String]>([])
        debouncer.call { ran.withLock { $0.append("A@\(manual.now)") } }
        debouncer.flush()
        debouncer.call { ran.withLock { $0.append("B@\(manual.now)") } }
        debouncer.flush()
        debouncer.call { ran.withLock { $0.append("C@\(manual.now)") } }
        manual.advance(by: .seconds(5))
        #expect(ran.withLock { $0 } == ["A@0.0 seconds", "B@0.0 seconds", "C@1.0 seconds"])
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

    @Test("an immediate first tick does not jump ahead of an entry armed earlier for the same instant")
    func immediateTickKeepsArmingOrder() {
        let manual = ManualTimerScheduler()
        let log = StateLock<[String]>([])
        let work = DelayedWork.schedule(after: .zero, scheduler: manual) { log.withLock { $0.append("delayed") } }
        let timer = RepeatingTimer(interval: .seconds(1), repetitions: 1, firesImmediately: true, scheduler: manual) {
            log.withLock { $0.append("timer") }
        }
        timer.start()
        manual.advance(by: .zero)
        #expect(log.withLock { $0 } == ["delayed", "timer"])
        _ = work
    }

    @Test("kick() says whether it took effect: not once the deadline has passed")
    func kickReportsWhetherItTookEffect() {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        let recorder = DeliveryRecorder()
        let dog = WatchdogCore(
            timeout: .milliseconds(100), executor: .recorder(recorder), engine: EngineReference(manual)
        ) {
            fired.increment()
        }
        #expect(dog.kick() == true)
        manual.advance(by: .milliseconds(100))
        #expect(recorder.takeAll().count == 1, "the deadline passed: the handler is about to begin")
        #expect(dog.kick(timeout: .seconds(10)) == false)
        let watchdog = Watchdog(timeout: .seconds(1), scheduler: manual) {}
        #expect(watchdog.kick())
        watchdog.invalidate()
        #expect(!watchdog.kick())
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
}

/// One test per break found by attacking the clock and deadline APIs.
@Suite("Regressions: clocks and deadlines")
struct ClockRegressionTests {
    @Test("a zero-interval throttler whose action calls it again cannot hang advance or runUntilIdle")
    func selfRetriggeringThrottlerTerminates() {
        let manual = ManualTimerScheduler()
        let throttler = Throttler(interval: .zero, scheduler: manual)
        let runs = Counter()
        @Sendable func tick() {
            runs.increment()
            throttler.call { tick() }
        }
        throttler.call { tick() }
        manual.advance(by: .zero)
        #expect(runs.count == TimerEngine.deliveryLimitPerInstant, "stopped at the limit, the rest queued")
        #expect(manual.runUntilIdle(limit: 1) == 1)
        throttler.cancel()
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

    @Test("advance(to:) an instant in the past runs everything already due")
    func advanceToPastRunsAllDue() {
        let manual = ManualTimerScheduler()
        manual.advance(by: .seconds(10))
        let ran = StateLock<[String]>([])
        let a = DelayedWork.schedule(at: manual.instant - .seconds(5), scheduler: manual) {
            ran.withLock { $0.append("A") }
        }
        let b = DelayedWork.schedule(at: manual.instant - .seconds(1), scheduler: manual) {
            ran.withLock { $0.append("B") }
        }
        manual.advance(to: .seconds(7))
        #expect(ran.withLock { $0 } == ["A", "B"])
        #expect(manual.now == .seconds(10))
        _ = (a, b)
    }

    @Test("leading debounce: the first call of a burst made while an action runs runs right after it")
    func leadingCallWhileRunning() {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .seconds(1), leading: true, scheduler: manual)
        let ran = StateLock<[String]>([])
        debouncer.call { ran.withLock { $0.append("A@\(manual.now)") } }
        debouncer.call {
            ran.withLock { $0.append("B@\(manual.now)") }
            debouncer.call { ran.withLock { $0.append("X@\(manual.now)") } }  // a new burst's first call
        }
        manual.advance(by: .seconds(5))
        #expect(ran.withLock { $0 } == ["A@0.0 seconds", "B@1.0 seconds", "X@1.0 seconds"])
    }
}
