import Dispatch
import Foundation
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// The real-time engine's shards: threads arm into different shards, a cancel
/// finds the entry wherever it is, and the one scheduler thread serves them all.
/// Real time with generous bounds; run under ThreadSanitizer too.
@Suite("Sharded engine (real time)")
struct ShardedEngineTests {
    /// Runs `body` on a new thread and returns its result once it has returned.
    private func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
            Thread { continuation.resume(returning: body()) }.start()
        }
    }

    @Test("a real engine has several shards, a manual one exactly one")
    func shardCounts() {
        #expect(SystemTimerScheduler().engine.shardCount >= 2)
        #expect(SystemTimerScheduler().engine.shardCount.nonzeroBitCount == 1)
        #expect(TimerEngine(virtual: true).shardCount == 1)
    }

    @Test("threads are dealt distinct numbers, and a thread arms into the shard its number names")
    func threadsGetTheirShards() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let mask = engine.shardCount - 1
        var numbers: [Int] = []
        for name in ["a", "b", "c"] {
            let (number, shard) = await onOwnThread { () -> (Int, Int) in
                let entry = RecordingEntry(name)
                entry.arm(engine, at: engine.nowTicks + 3_600_000_000_000)
                defer { _ = entry.cancel(engine) }
                return (ThreadIdentity.shard(), entry.timerSlot >> TimerEngine.shardShift)
            }
            #expect(shard == number & mask)
            numbers.append(number)
        }
        #expect(Set(numbers).count == 3)
        #expect(ThreadIdentity.shard() == ThreadIdentity.shard())
        #expect(scheduler.pendingCount == 0)
    }

    @Test("a cancel on another thread finds the entry in its shard and releases what it holds")
    func crossThreadCancelReleases() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        weak var weakProbe: Probe?
        let entry: RecordingEntry = await onOwnThread {
            let probe = Probe()
            let entry = RecordingEntry("far", payload: probe)
            entry.arm(engine, at: engine.nowTicks + 3_600_000_000_000)
            return entry
        }
        entry.payload.withLock { weakProbe = $0 }
        #expect(weakProbe != nil)
        let cancelled = await onOwnThread { entry.cancel(engine) }
        #expect(cancelled)
        #expect(weakProbe == nil)
        #expect(entry.timerSlot == -1)
        #expect(scheduler.pendingCount == 0)
    }

    @Test("an entry re-armed from another thread moves within its shard and fires once, at the new deadline")
    func crossThreadReArm() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let log = FireLog()
        let fired = DispatchSemaphore(value: 0)
        let entry = RecordingEntry("moved") { name, _ in
            log.record(name)
            fired.signal()
        }
        await onOwnThread { entry.arm(engine, at: engine.nowTicks + 3_600_000_000_000) }
        let shard = entry.timerSlot >> TimerEngine.shardShift
        let slotAfterMove = await onOwnThread { () -> Int in
            entry.arm(engine, at: engine.nowTicks + 200_000_000)
            return entry.timerSlot
        }
        // Still in its shard, unless a very slow machine already fired it.
        #expect(slotAfterMove >> TimerEngine.shardShift == shard || log.count == 1)
        #expect(fired.wait(timeout: .now() + 10) == .success)
        usleep(50_000)
        #expect(log.names == ["moved"])
        #expect(scheduler.pendingCount == 0)
    }

    @Test("an earlier deadline armed in another shard wakes the sleeping scheduler thread")
    func earlierDeadlineInAnotherShardWakes() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let far = RecordingEntry("far")
        await onOwnThread { far.arm(engine, at: engine.nowTicks + 3_600_000_000_000) }
        usleep(100_000)  // the thread sleeps until the far deadline
        let fired = DispatchSemaphore(value: 0)
        let soon = RecordingEntry("soon") { _, _ in fired.signal() }
        let farShard = far.timerSlot >> TimerEngine.shardShift
        var armedAt: Int64? = nil
        for _ in 0..<64 where armedAt == nil {
            // A thread whose shard is not the far entry's (threads are dealt out
            // round-robin, so one comes soon).
            armedAt = await onOwnThread { () -> Int64? in
                guard ThreadIdentity.shard() & (engine.shardCount - 1) != farShard else { return nil }
                let now = engine.nowTicks
                soon.arm(engine, at: now + 10_000_000)
                return now
            }
        }
        #expect(soon.timerSlot >> TimerEngine.shardShift != farShard)
        #expect(fired.wait(timeout: .now() + 10) == .success)
        #expect(engine.nowTicks - (armedAt ?? 0) >= 10_000_000)
        #expect(far.cancel(engine))
    }

    /// Threads arm entries into their shards, then move and cancel entries that
    /// another thread armed (so in another shard) while the scheduler thread
    /// fires them: an entry moved from far away to soon fires exactly once; an
    /// entry cancelled while due fires or is cancelled, never both, never twice;
    /// nothing stays armed, and every payload is released.
    @Test("racing moves, cancels and firings across shards: every entry ends exactly one way")
    func racingAcrossShards() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let count = 4_000
        let lanes = 4
        let fired = FiredFlags(count: count)
        weak var anyProbe: Probe?
        let entries = (0..<count).map { number in
            let probe = Probe()
            if number == 1 { anyProbe = probe }
            return RecordingEntry("\(number)", payload: probe) { _, _ in fired.mark(number) }
        }
        let armed = Counter()
        let cancelledByLane = await withTaskGroup(of: [Int].self) { group in
            for lane in 0..<lanes {
                group.addTask {
                    await onOwnThread {
                        var cancelled: [Int] = []
                        var generator = SplitMix64(seed: UInt64(lane) &+ 11)
                        let now = engine.nowTicks
                        // Even entries far away, odd ones due within 20 ms.
                        for number in stride(from: lane, to: count, by: lanes) {
                            let delay = number % 2 == 0 ? 3_600_000_000_000 : Int64(generator.next() % 40) * 500_000
                            entries[number].arm(engine, at: now + delay)
                        }
                        armed.increment()
                        while armed.count < lanes { sched_yield() }
                        // The next lane's entries: another shard.
                        for number in stride(from: (lane + 1) % lanes, to: count, by: lanes) {
                            if number % 2 == 0 {
                                entries[number].arm(
                                    engine, at: engine.nowTicks + Int64(generator.next() % 20) * 500_000)
                            } else if engine.disarm(entries[number]) {
                                cancelled.append(number)
                            }
                        }
                        return cancelled
                    }
                }
            }
            var all: [Int] = []
            for await part in group { all += part }
            return all
        }
        let cancelled = Set(cancelledByLane)
        let deadline = Date().addingTimeInterval(30)
        while fired.total + cancelled.count < count && Date() < deadline { usleep(1_000) }
        usleep(50_000)  // a second firing of anything would show now
        #expect(fired.total + cancelled.count == count)
        for number in 0..<count {
            #expect(fired.isMarked(number) != cancelled.contains(number), "entry \(number)")
        }
        #expect(scheduler.pendingCount == 0)
        for entry in entries { _ = entry.cancel(engine) }  // drops the payloads
        #expect(anyProbe == nil)
    }

    @Test("a DelayedWork on a released private scheduler keeps its engine and still runs; the engine goes after")
    func delayedWorkKeepsPrivateEngine() async {
        weak var weakEngine: TimerEngine?
        let ran = DispatchSemaphore(value: 0)
        var work: DelayedWork?
        do {
            let scheduler = SystemTimerScheduler()
            weakEngine = scheduler.engine
            work = DelayedWork.schedule(after: .milliseconds(20), scheduler: scheduler) { ran.signal() }
        }
        #expect(weakEngine != nil, "the pending work keeps the engine")
        #expect(ran.wait(timeout: .now() + 10) == .success)
        let deadline = Date().addingTimeInterval(10)
        while work?.state != .completed && Date() < deadline { try? await Task.sleep(for: .milliseconds(5)) }
        #expect(work?.state == .completed)
        work = nil
        // The retired engine's thread ends once nothing is armed; then nothing refers to it.
        while weakEngine != nil && Date() < deadline { try? await Task.sleep(for: .milliseconds(10)) }
        #expect(weakEngine == nil)
    }

    @Test("the default scheduler is the shared one: DelayedWork armed without one runs on the shared engine")
    func delayedWorkDefaultsToShared() {
        let ran = DispatchSemaphore(value: 0)
        let work = DelayedWork.schedule(after: .milliseconds(5)) { ran.signal() }
        #expect(work.engine === SystemTimerScheduler.shared.engine)
        #expect(ran.wait(timeout: .now() + 10) == .success)
        let cancelled = DelayedWork.schedule(after: .seconds(3600)) {}
        #expect(cancelled.cancel())
        #expect(!cancelled.holdsWork)
    }
}
