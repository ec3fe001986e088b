import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// What a `ManualTimerScheduler` promises: due work runs in (deadline, arming) order, work armed
/// during an advance keeps that order, and no advance loops forever.
@Suite("Virtual time: one total order, every advance ends, nothing runs outside it")
struct VirtualTimeOrderingTests {
    @Test("Work armed during an advance for past instants runs at the next instant in (deadline, arming) order")
    func pastArmingKeepsTheTotalOrder() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let late = HandleBox<DelayedWork>()
        late.set(DelayedWork.schedule(after: .seconds(30), scheduler: manual) { log.add("late@30→5") })
        _ = DelayedWork.schedule(after: .seconds(10), scheduler: manual) {
            log.add("A@10")
            let now = manual.clock.now
            _ = DelayedWork.schedule(after: .zero, scheduler: manual) { log.add("zero@10") }
            _ = DelayedWork.schedule(at: now - .seconds(7), scheduler: manual) { log.add("past@3") }
            late.get!.reschedule(at: now - .seconds(5))
            _ = DelayedWork.schedule(after: .seconds(-100), scheduler: manual) { log.add("neg@0") }
            _ = DelayedWork.schedule(at: now - .seconds(5), scheduler: manual) { log.add("past@5-b") }
        }
        _ = DelayedWork.schedule(after: .seconds(10), scheduler: manual) { log.add("B@10") }
        _ = DelayedWork.schedule(after: .seconds(20), scheduler: manual) { log.add("C@20") }
        manual.advance(by: .seconds(25))
        #expect(
            log.all == ["A@10", "B@10", "past@3", "late@30→5", "past@5-b", "zero@10", "neg@0", "C@20"])
        #expect(manual.pendingCount == 0)
    }

    @Test("Work armed at the last instant of an advance waits, counted and cancellable, and runs in the next advance")
    func pastArmingAtTheEndWaitsForTheNextAdvance() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let kept = HandleBox<DelayedWork>()
        let dropped = HandleBox<DelayedWork>()
        _ = DelayedWork.schedule(after: .seconds(10), scheduler: manual) {
            log.add("A")
            kept.set(DelayedWork.schedule(after: .zero, scheduler: manual) { log.add("kept") })
            dropped.set(
                DelayedWork.schedule(at: manual.clock.now - .seconds(1), scheduler: manual) { log.add("dropped") })
            let inner = DelayedWork.schedule(after: .zero, scheduler: manual) { log.add("cancelled-in-advance") }
            #expect(inner.cancel())
        }
        manual.advance(by: .seconds(10))
        #expect(log.all == ["A"])
        #expect(manual.pendingCount == 2)
        #expect(dropped.get!.cancel())
        #expect(manual.pendingCount == 1)
        manual.advance(by: .zero)
        #expect(log.all == ["A", "kept"])
        #expect(manual.pendingCount == 0)
    }

    @Test("Zero-delay work that keeps re-arming itself never makes an advance loop forever")
    func selfRearmingZeroDelayTerminates() {
        let manual = ManualTimerScheduler()
        let count = Atomic<Int>(0)
        let work = HandleBox<DelayedWork>()
        @Sendable func again() {
            count.add(1, ordering: .relaxed)
            work.set(DelayedWork.schedule(after: .zero, scheduler: manual) { again() })
        }
        work.set(DelayedWork.schedule(after: .zero, scheduler: manual) { again() })
        manual.advance(by: .seconds(1))
        let afterFirst = count.load(ordering: .relaxed)
        #expect(afterFirst <= 2)
        manual.advance(by: .zero)
        #expect(count.load(ordering: .relaxed) == afterFirst + 1)
        #expect(manual.pendingCount == 1)
        work.get!.cancel()
        #expect(manual.pendingCount == 0)
    }

    @Test("A reschedule into the past from a handler, then a cancel in the same advance, leaves nothing pending")
    func rescheduleThenCancelInTheSameAdvance() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let target = DelayedWork.schedule(after: .seconds(50), scheduler: manual) { log.add("target") }
        _ = DelayedWork.schedule(after: .seconds(10), scheduler: manual) {
            #expect(target.reschedule(after: .seconds(-3)))
            #expect(manual.pendingCount == 1)
            #expect(target.cancel())
            #expect(manual.pendingCount == 0)
        }
        manual.advance(by: .seconds(100))
        #expect(log.all.isEmpty)
        #expect(manual.pendingCount == 0)
    }

    @Test("A repeating timer's re-arm is ordered by when it re-armed, against work armed earlier for the same instant")
    func repeatingTimerReArmOrder() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let timer = RepeatingTimer(interval: .seconds(10), repetitions: 2, scheduler: manual) {
            log.add("tick@\(manual.now)")
        }
        timer.start()
        _ = DelayedWork.schedule(after: .seconds(10), scheduler: manual) { log.add("work@10") }
        manual.advance(by: .seconds(5))
        _ = DelayedWork.schedule(after: .seconds(15), scheduler: manual) { log.add("work@20") }
        manual.advance(by: .seconds(30))
        #expect(log.all == ["tick@10.0 seconds", "work@10", "work@20", "tick@20.0 seconds"])
    }

    @Test("Handlers that call back into their own object neither deadlock nor change a run that began")
    func reentrantHandlers() {
        let manual = ManualTimerScheduler()
        let results = LabelLog()
        let workBox = HandleBox<DelayedWork>()
        workBox.set(
            DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
                let work = workBox.get!
                results.add("state:\(work.state)")
                results.add("reschedule:\(work.reschedule(after: .zero))")
                results.add("cancel:\(work.cancel())")
            })
        let dogBox = HandleBox<Watchdog>()
        dogBox.set(
            Watchdog(timeout: .seconds(2), scheduler: manual) {
                let dog = dogBox.get!
                results.add("kick:\(dog.kick())")
                dog.invalidate()
                results.add("fired:\(dog.hasFired)")
            })
        manual.advance(by: .seconds(5))
        #expect(results.all == ["state:running", "reschedule:false", "cancel:false", "kick:false", "fired:true"])
        #expect(workBox.get!.state == .completed)
        #expect(manual.pendingCount == 0)
    }

    @Test("After an advance to the end of time, zero-delay work still runs and far work never does")
    func workAtTheEndOfTime() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        _ = DelayedWork.schedule(after: .seconds(1), scheduler: manual) { log.add("early") }
        let never = DelayedWork.schedule(after: .seconds(Int64.max), scheduler: manual) { log.add("never") }
        manual.advance(by: .seconds(Int64.max))
        #expect(log.all == ["early"])
        #expect(manual.pendingCount == 1)
        _ = DelayedWork.schedule(after: .zero, scheduler: manual) { log.add("asap") }
        _ = DelayedWork.schedule(at: manual.clock.now - .seconds(5), scheduler: manual) { log.add("past") }
        manual.advance(by: .zero)
        manual.advance(by: .seconds(1))
        #expect(log.all == ["early", "past", "asap"])
        #expect(never.cancel())
        #expect(manual.pendingCount == 0)
    }

    @Test("An advance by a negative duration or to a past instant runs what is due and leaves the clock")
    func advanceBackwards() {
        let manual = ManualTimerScheduler()
        manual.advance(by: .seconds(10))
        let log = LabelLog()
        _ = DelayedWork.schedule(after: .zero, scheduler: manual) { log.add("due") }
        manual.advance(by: .seconds(-3))
        #expect(log.all == ["due"])
        #expect(manual.now == .seconds(10))
        _ = DelayedWork.schedule(after: .zero, scheduler: manual) { log.add("due2") }
        manual.advance(to: .seconds(2))
        #expect(log.all == ["due", "due2"])
        #expect(manual.now == .seconds(10))
        _ = DelayedWork.schedule(after: .zero, scheduler: manual) { log.add("due3") }
        manual.advance(to: manual.clock.now - .seconds(100))
        #expect(log.all == ["due", "due2", "due3"])
        #expect(manual.now == .seconds(10))
    }

    @Test("runUntilIdle ends with work that re-arms itself at zero delay and leaves it pending")
    func runUntilIdleWithSelfRearming() {
        let manual = ManualTimerScheduler()
        let runs = Atomic<Int>(0)
        let box = HandleBox<DelayedWork>()
        @Sendable func again() {
            runs.add(1, ordering: .relaxed)
            box.set(DelayedWork.schedule(after: .zero, scheduler: manual) { again() })
        }
        box.set(DelayedWork.schedule(after: .seconds(1), scheduler: manual) { again() })
        let rounds = manual.runUntilIdle(limit: 50)
        #expect(rounds == 50)
        #expect(runs.load(ordering: .relaxed) >= 49)
        #expect(manual.pendingCount == 1)
        box.get!.cancel()
        #expect(manual.runUntilIdle() == 0)
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
}
