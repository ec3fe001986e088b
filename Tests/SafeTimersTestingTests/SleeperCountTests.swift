import Dispatch
import Foundation
@_spi(SchedulerImplementation) import SafeTimers
import SafeTimersTesting
import Synchronization
import Testing

/// Flags shared between the racing threads and tasks.
private final class SleeperRaceFlags: Sendable {
    let stop = Atomic<Bool>(false)
    let lowest = Atomic<Int>(0)
    let reads = Atomic<Int>(0)
    let sleeps = Atomic<Int>(0)
}

@Suite("Sleeper count and waitForSleepers")
struct SleeperCountTests {
    @Test("sleeperCount never reads negative while sleeps at now fire and are cancelled from other threads")
    func sleeperCountNeverNegative() async {
        let manual = ManualTimerScheduler()
        let race = SleeperRaceFlags()
        let workersDone = Atomic<Bool>(false)
        let threadsDone = DispatchGroup()
        // Advances until every worker has ended: a sleep armed after the race
        // stopped still needs an advance to return. On threads of their own, not
        // the global queue: two blocks spinning there would take all of its
        // width on 2 cores and starve other suites' handlers.
        threadsDone.enter()
        Thread {
            defer { threadsDone.leave() }
            while !workersDone.load(ordering: .relaxed) {
                manual.advance(by: .zero)
                // Gently until the workers run (the suites beside this one may
                // hold the task pool's threads for a while).
                if race.sleeps.load(ordering: .relaxed) == 0 { usleep(200) }
            }
        }.start()
        threadsDone.enter()
        Thread {
            defer { threadsDone.leave() }
            Self.readSleeperCount(of: manual, race)
        }.start()
        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<4 {
                group.addTask {
                    var round = worker
                    while !race.stop.load(ordering: .relaxed) {
                        round += 1
                        let sleep = Task { try? await manual.clock.sleep(until: manual.clock.now) }
                        if round % 2 == 0 { sleep.cancel() }
                        await sleep.value
                        race.sleeps.add(1, ordering: .relaxed)
                    }
                }
            }
        }
        workersDone.store(true, ordering: .relaxed)
        await withCheckedContinuation { continuation in
            threadsDone.notify(queue: .global()) { continuation.resume() }
        }
        manual.advance(by: .zero)
        let sleeps = race.sleeps.load(ordering: .relaxed)
        print("sleeperCount race: \(sleeps) sleeps, \(race.reads.load(ordering: .relaxed)) reads")
        // How many sleeps the race made depends on the machine's load (2,000
        // or 30 s, whichever first; the old race showed within 3 s, ~1,000
        // sleeps, on an idle machine): printed above, not bounded.
        #expect(race.lowest.load(ordering: .relaxed) >= 0)
        #expect(manual.sleeperCount == 0)
    }

    /// Reads `manual.sleeperCount` without a pause, keeping the lowest value
    /// read, until it reads negative, or for 5 s and 2,000 sleeps (30 s at
    /// most) from the first sleep that returned; then stops the race.
    private static func readSleeperCount(of manual: ManualTimerScheduler, _ race: SleeperRaceFlags) {
        let begun = ContinuousClock.now
        while race.sleeps.load(ordering: .relaxed) == 0 && ContinuousClock.now - begun < .seconds(120) {
            usleep(1_000)
        }
        let start = ContinuousClock.now
        while !race.stop.load(ordering: .relaxed) {
            let count = manual.sleeperCount
            race.lowest.store(min(count, race.lowest.load(ordering: .relaxed)), ordering: .relaxed)
            race.reads.add(1, ordering: .relaxed)
            let elapsed = ContinuousClock.now - start
            let enough = elapsed > .seconds(5) && race.sleeps.load(ordering: .relaxed) >= 2_000
            if count < 0 || enough || elapsed > .seconds(30) { race.stop.store(true, ordering: .relaxed) }
        }
    }

    @Test("a cancelled waitForSleepers returns, whether cancelled before or while it waits, and frees its registration")
    func cancelledWaitReturns() async {
        let manual = ManualTimerScheduler()
        let before = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            await manual.waitForSleepers(1)
        }
        #expect(await ends(before), "a wait cancelled before it began never returned")
        let waiting = Task { await manual.waitForSleepers(1) }
        while manual.engine.sleeperWaitCount == 0 { await Task.yield() }
        waiting.cancel()
        #expect(await ends(waiting), "a wait cancelled while it waited never returned")
        let racing = (0..<50).map { _ in Task { await manual.waitForSleepers(2) } }
        for task in racing { task.cancel() }
        let all = Task { for task in racing { await task.value } }
        #expect(await ends(all), "a wait cancelled as it began never returned")
        #expect(manual.engine.sleeperWaitCount == 0)
        #expect(manual.sleeperCount == 0)
        // A wait that is not cancelled still waits for its count.
        let sleeper = Task { try await manual.clock.sleep(for: .seconds(1)) }
        await manual.waitForSleepers(1)
        #expect(manual.engine.sleeperWaitCount == 0)
        manual.advance(by: .seconds(1))
        try? await sleeper.value
        #expect(manual.sleeperCount == 0)
    }

    /// Whether `task` ends within 20 s (a wait that ignores its cancellation
    /// would hang the test instead of failing it).
    private func ends(_ task: Task<Void, Never>) async -> Bool {
        let first = FirstOutcome()
        return await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            Task {
                await task.value
                if first.claim() { continuation.resume(returning: true) }
            }
            Task {
                try? await Task.sleep(for: .seconds(20))
                if first.claim() { continuation.resume(returning: false) }
            }
        }
    }
}

/// Lets exactly one of two racing outcomes resume a continuation.
private final class FirstOutcome: Sendable {
    private let taken = Atomic<Bool>(false)
    func claim() -> Bool { !taken.exchange(true, ordering: .relaxed) }
}
