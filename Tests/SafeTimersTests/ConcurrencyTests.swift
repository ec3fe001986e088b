import Dispatch
import Foundation
import Synchronization
import Testing

@testable import SafeTimers

/// Real-time tests of thread safety, meant to run under ThreadSanitizer too
/// (`swift test --sanitize=thread`, as CI does). They assert outcomes, never speed.
@Suite("Concurrency (real time)")
struct ConcurrencyTests {
    @Test("8 threads, 1M random calls and releases on shared timers: no trap, valid states, quiet after cancel")
    func fuzzRepeatingTimers() {
        let scheduler = SystemTimerScheduler()
        let slotCount = 16
        let threads = 8
        let operationsPerThread = 125_000
        let fired = Counter()
        let afterCancel = Flag()
        let lateBegins = Counter()
        @Sendable func makeTimer(_ number: Int) -> RepeatingTimer {
            RepeatingTimer(
                interval: .milliseconds(1 + number % 3), repetitions: number % 4 == 0 ? 5 : nil,
                firesImmediately: number % 2 == 0, missedTicks: [.skip, .coalesce, .catchUp(limit: 3)][number % 3],
                scheduler: scheduler
            ) {
                if afterCancel.isSet { lateBegins.increment() }
                fired.increment()
            }
        }
        // Each slot's timer with the number it was made from (which decides its
        // repetitions: every fourth is limited to 5).
        let slots = StateLock((0..<slotCount).map { (number: $0, timer: makeTimer($0)) })
        DispatchQueue.concurrentPerform(iterations: threads) { lane in
            var random = SplitMix64(seed: UInt64(lane) &+ 1)
            for step in 0..<operationsPerThread {
                if step % 4_000 == 0 { usleep(2_000) }  // let the handlers' queue run now and then
                Self.randomCall(step: step, &random, slots: slots, makeTimer: makeTimer)
            }
        }
        let all = slots.withLock { $0.map(\.timer) }
        // Bring every timer back to running and let each fire, so the final cancel
        // races live handlers.
        let firedBefore = fired.count
        for timer in all {
            timer.start()
            timer.resume()
        }
        waitUntil { fired.count >= firedBefore + slotCount }
        #expect(fired.count >= firedBefore + slotCount)
        for timer in all { timer.cancel() }
        afterCancel.set()
        // Give any straggler the chance to (wrongly) run.
        usleep(50_000)
        #expect(lateBegins.count == 0, "a handler began after cancel() returned")
        for timer in all { #expect(timer.state == .cancelled) }
    }

    /// One random call on a random slot's timer (`makeTimer` numbers a new one
    /// with `step`): start, suspend, resume, cancel, a snapshot check, or a
    /// release (the slot gets a new timer; the old one dies wherever its last
    /// reference goes).
    private static func randomCall(
        step: Int, _ random: inout SplitMix64, slots: borrowing StateLock<[(number: Int, timer: RepeatingTimer)]>,
        makeTimer: (Int) -> RepeatingTimer
    ) {
        let slot = Int(random.next() % UInt64(slots.withLock { $0.count }))
        let operation = random.next() % 16
        if operation == 15 {
            let fresh = makeTimer(step)
            let old = slots.withLock { slots in
                defer { slots[slot] = (step, fresh) }
                return slots[slot]
            }
            _ = old
            return
        }
        let (number, timer) = slots.withLock { $0[slot] }
        switch operation {
        case 0...3: timer.start()
        case 4...6: timer.suspend()
        case 7...9: timer.resume()
        case 10...11: timer.cancel()
        default: checkSnapshot(of: timer, limited: number % 4 == 0)
        }
    }

    /// What can be read of a timer without racing the other threads' calls: only
    /// a limited timer (5 repetitions) finishes, and no start lets it run more
    /// often than its limit.
    private static func checkSnapshot(of timer: RepeatingTimer, limited: Bool) {
        if limited {
            let count = timer.fireCount
            #expect(count <= 5, "a timer limited to 5 repetitions ran \(count) times since its start")
        } else {
            let state = timer.state
            #expect(state != .finished, "a timer without a repetition limit finished")
        }
    }

    @Test("cancel barrier: no RepeatingTimer handler begins after cancel() returned")
    func repeatingTimerBarrier() {
        let scheduler = SystemTimerScheduler()
        for iteration in 0..<400 {
            let cancelled = Atomic<Bool>(false)
            let violations = Counter()
            let fired = Counter()
            let running = Atomic<Int>(0)
            let timer = RepeatingTimer(interval: .milliseconds(1), firesImmediately: true, scheduler: scheduler) {
                running.add(1, ordering: .sequentiallyConsistent)
                if cancelled.load(ordering: .acquiring) { violations.increment() }
                fired.increment()
                if iteration % 2 == 0 { usleep(50) }  // sometimes still running when cancel comes
                running.subtract(1, ordering: .sequentiallyConsistent)
            }
            timer.start()
            while fired.count < 1 + iteration % 3 { sched_yield() }
            timer.cancel()
            #expect(running.load(ordering: .sequentiallyConsistent) == 0, "cancel() returned while a handler ran")
            cancelled.store(true, ordering: .releasing)
            let firedAtCancel = fired.count
            usleep(2_000)
            #expect(violations.count == 0, "iteration \(iteration)")
            #expect(fired.count == firedAtCancel, "iteration \(iteration)")
        }
    }

    @Test("cancel barrier: DelayedWork either is prevented or has completed when cancel() returns")
    func delayedWorkBarrier() {
        let scheduler = SystemTimerScheduler()
        var prevented = 0
        var completed = 0
        for iteration in 0..<3_000 {
            let cancelled = Atomic<Bool>(false)
            let violations = Counter()
            let ran = Counter()
            let work = DelayedWork.schedule(after: .microseconds(iteration % 200), scheduler: scheduler) {
                if cancelled.load(ordering: .acquiring) { violations.increment() }
                if iteration % 3 == 0 { usleep(20) }
                ran.increment()
            }
            var spin = iteration % 500
            while spin > 0 {
                spin -= 1
                _ = work.state
            }
            let didPrevent = work.cancel()
            cancelled.store(true, ordering: .releasing)
            if didPrevent {
                prevented += 1
                #expect(work.state == .cancelled)
                #expect(ran.count == 0)
            } else {
                completed += 1
                #expect(work.state == .completed, "cancel() returned false, so the run must have ended")
                #expect(ran.count == 1)
            }
            #expect(violations.count == 0)
        }
        #expect(prevented + completed == 3_000)
    }

    @Test("cancel barrier: Watchdog handler never begins after invalidate() returned")
    func watchdogBarrier() {
        let scheduler = SystemTimerScheduler()
        for iteration in 0..<2_000 {
            let invalidated = Atomic<Bool>(false)
            let violations = Counter()
            let dog = Watchdog(timeout: .microseconds(iteration % 150), scheduler: scheduler) {
                if invalidated.load(ordering: .acquiring) { violations.increment() }
            }
            for _ in 0..<(iteration % 300) { _ = dog.hasFired }
            dog.invalidate()
            invalidated.store(true, ordering: .releasing)
            #expect(violations.count == 0)
        }
        usleep(5_000)
    }

    @Test("leak probes in real time: captures are freed after cancel, after run, and after release")
    func leakProbes() {
        let scheduler = SystemTimerScheduler()
        let released = Counter()
        // Cancelled DelayedWork.
        let cancelled: DelayedWork = {
            let captured = Tracked { released.increment() }
            return DelayedWork.schedule(after: .seconds(60), scheduler: scheduler) { captured.touch() }
        }()
        #expect(cancelled.cancel())
        #expect(released.count == 1)
        // DelayedWork that ran: the closure goes right after the run.
        let ran: DelayedWork = {
            let captured = Tracked { released.increment() }
            return DelayedWork.schedule(after: .zero, scheduler: scheduler) { captured.touch() }
        }()
        waitUntil { ran.state == .completed && released.count == 2 }
        #expect(released.count == 2)
        // A running RepeatingTimer, released.
        let fired = Counter()
        do {
            let captured = Tracked { released.increment() }
            let timer = RepeatingTimer(interval: .milliseconds(1), scheduler: scheduler) {
                captured.touch()
                fired.increment()
            }
            timer.start()
            waitUntil { fired.count >= 3 }
        }
        waitUntil { released.count == 3 }
        #expect(released.count == 3)
        // A watchdog that fired.
        let dog: Watchdog = {
            let captured = Tracked { released.increment() }
            return Watchdog(timeout: .zero, scheduler: scheduler) { captured.touch() }
        }()
        waitUntil { dog.hasFired && released.count == 4 }
        #expect(released.count == 4)
        waitUntil { scheduler.pendingCount == 0 }
        #expect(scheduler.pendingCount == 0)
    }
}

/// A one-way flag that closures of any isolation can share.
final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    var isSet: Bool { value.load(ordering: .acquiring) }
    func set() { value.store(true, ordering: .releasing) }
}
