import Dispatch
@_spi(SchedulerImplementation) import SafeTimers
import SafeTimersTesting
import Synchronization
import Testing

/// Flags shared between the attack's threads and tasks.
private final class SleeperAttack: Sendable {
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
        let attack = SleeperAttack()
        let threadsDone = DispatchGroup()
        DispatchQueue.global().async(group: threadsDone) {
            while !attack.stop.load(ordering: .relaxed) { manual.advance(by: .zero) }
        }
        DispatchQueue.global().async(group: threadsDone) {
            let start = ContinuousClock.now
            while !attack.stop.load(ordering: .relaxed) {
                let count = manual.sleeperCount
                attack.lowest.store(min(count, attack.lowest.load(ordering: .relaxed)), ordering: .relaxed)
                attack.reads.add(1, ordering: .relaxed)
                if count < 0 || ContinuousClock.now - start > .seconds(3) {
                    attack.stop.store(true, ordering: .relaxed)
                }
            }
        }
        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<4 {
                group.addTask {
                    var round = worker
                    while !attack.stop.load(ordering: .relaxed) {
                        round += 1
                        let sleep = Task { try? await manual.clock.sleep(until: manual.clock.now) }
                        if round % 2 == 0 { sleep.cancel() }
                        await sleep.value
                        attack.sleeps.add(1, ordering: .relaxed)
                    }
                }
            }
        }
        await withCheckedContinuation { continuation in
            threadsDone.notify(queue: .global()) { continuation.resume() }
        }
        manual.advance(by: .zero)
        print(
            "sleeperCount attack: \(attack.sleeps.load(ordering: .relaxed)) sleeps, "
                + "\(attack.reads.load(ordering: .relaxed)) reads, lowest \(attack.lowest.load(ordering: .relaxed))")
        #expect(attack.lowest.load(ordering: .relaxed) >= 0)
        #expect(manual.sleeperCount == 0)
    }

    @Test("a cancelled waitForSleepers returns, whether cancelled before or while it waits, and frees its registration")
    func cancelledWaitReturns() async {
        let manual = ManualTimerScheduler()
        let before = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            await manual.waitForSleepers(1)
        }
        await before.value
        let waiting = Task { await manual.waitForSleepers(1) }
        while manual.engine.sleeperWaitCount == 0 { await Task.yield() }
        waiting.cancel()
        await waiting.value
        let racing = (0..<50).map { _ in Task { await manual.waitForSleepers(2) } }
        for task in racing { task.cancel() }
        for task in racing { await task.value }
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
}
