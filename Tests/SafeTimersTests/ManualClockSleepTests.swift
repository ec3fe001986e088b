import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// `waitForSleepers(_:)` and the sleeper count under cancels, churn and extreme deadlines.
@Suite("Sleeps on a manual clock: counted, cancellable, woken by advances")
struct ManualClockSleepTests {
    @Test("A waitForSleepers cancelled before it starts returns and leaves nothing registered")
    func waitForSleepersCancelledBefore() async {
        let manual = ManualTimerScheduler()
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            await manual.waitForSleepers(3)
        }
        await task.value
        #expect(manual.engine.sleeperWaitCount == 0)
    }

    @Test("A waitForSleepers cancelled while it waits returns and leaves nothing registered")
    func waitForSleepersCancelledWhileWaiting() async {
        for _ in 0..<200 {
            let manual = ManualTimerScheduler()
            let task = Task { await manual.waitForSleepers(5) }
            // Cancel at varying moments: before, around and after registration.
            for _ in 0..<Int.random(in: 0..<3) { await Task.yield() }
            task.cancel()
            let done = Atomic<Bool>(false)
            let guardTask = Task {
                try? await Task.sleep(for: .seconds(20))
                if !done.load(ordering: .relaxed) { Issue.record("cancelled waitForSleepers never returned") }
            }
            await task.value
            done.store(true, ordering: .relaxed)
            guardTask.cancel()
            #expect(manual.engine.sleeperWaitCount == 0)
        }
    }

    @Test("sleeperCount never reads negative under sleeps, cancels and advances from many threads")
    func sleeperCountUnderChurn() async {
        let manual = ManualTimerScheduler()
        let flags = SharedFlags()
        let reader = Thread {
            while !flags.stop.load(ordering: .relaxed) {
                let count = manual.sleeperCount
                if count < flags.lowest.load(ordering: .relaxed) { flags.lowest.store(count, ordering: .relaxed) }
            }
        }
        reader.start()
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<400 {
                group.addTask {
                    let delay: Duration = [.zero, .nanoseconds(-1), .nanoseconds(1), .seconds(1)][index % 4]
                    let sleeper = Task { try? await manual.clock.sleep(for: delay) }
                    if index % 3 == 0 { sleeper.cancel() }
                    if index % 5 == 0 { manual.advance(by: .nanoseconds(1)) }
                    await sleeper.value
                }
            }
            group.addTask {
                while !flags.stop.load(ordering: .relaxed) {
                    manual.advance(by: .seconds(1))
                    await Task.yield()
                }
            }
            for _ in 0..<400 { await group.next() }
            flags.stop.store(true, ordering: .relaxed)
        }
        manual.advance(by: .seconds(10))
        #expect(flags.lowest.load(ordering: .relaxed) >= 0)
        #expect(manual.sleeperCount == 0)
        #expect(manual.pendingCount == 0)
    }

    @Test("A sleep until now on a manual clock returns at the next advance, even by zero")
    func sleepUntilNowOnManualClock() async throws {
        let manual = ManualTimerScheduler()
        manual.advance(by: .seconds(3))
        let task = Task { try await manual.clock.sleep(until: manual.clock.now) }
        await manual.waitForSleepers(1)
        #expect(manual.pendingCount == 1)
        manual.advance(by: .zero)
        try await task.value
        #expect(manual.sleeperCount == 0)
        #expect(manual.pendingCount == 0)
        // A past deadline returns at once, without suspending.
        try await manual.clock.sleep(until: manual.clock.now - .seconds(1))
        #expect(manual.sleeperCount == 0)
    }

    @Test("waitForSleepers with zero or a negative count returns at once and registers nothing")
    func waitForSleepersNonPositive() async {
        let manual = ManualTimerScheduler()
        await manual.waitForSleepers(0)
        await manual.waitForSleepers(-5)
        #expect(manual.engine.sleeperWaitCount == 0)
    }

    @Test("A sleep until the end of time counts as a sleeper and a cancel frees it")
    func sleepForeverThenCancel() async {
        let manual = ManualTimerScheduler()
        let task = Task { try await manual.clock.sleep(for: .seconds(Int64.max)) }
        await manual.waitForSleepers(1)
        #expect(manual.sleeperCount == 1)
        #expect(manual.pendingCount == 1)
        manual.advance(by: .seconds(1_000_000_000))
        #expect(manual.sleeperCount == 1)
        task.cancel()
        #expect((try? await task.value) == nil)
        #expect(manual.sleeperCount == 0)
        #expect(manual.pendingCount == 0)
    }

    @Test("waitForSleepers returns when sleepers that start on other threads reach the count")
    func waitForSleepersWithConcurrentSleepers() async {
        for _ in 0..<50 {
            let manual = ManualTimerScheduler()
            let sleepers = (0..<3).map { index in
                Task.detached { try? await manual.clock.sleep(for: .seconds(index + 1)) }
            }
            await manual.waitForSleepers(3)
            #expect(manual.sleeperCount == 3)
            manual.advance(by: .seconds(3))
            for sleeper in sleepers { await sleeper.value }
            #expect(manual.sleeperCount == 0)
            #expect(manual.engine.sleeperWaitCount == 0)
        }
    }
}
