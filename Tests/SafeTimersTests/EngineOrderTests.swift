import Dispatch
import Foundation
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// What the real-time engine promises about firing order across shards:
/// deadline order always (batch limit included); among entries due at the same
/// instant, arming order for one thread's entries; across threads, nothing.
/// Real time with generous bounds; run under ThreadSanitizer too.
@Suite("Engine firing order across shards (real time)")
struct EngineOrderTests {
    /// Runs `body` on a new thread and returns its result once it has returned.
    private func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
            Thread { continuation.resume(returning: body()) }.start()
        }
    }

    /// What fired, in order: (thread tag, index within its thread, deadline).
    private final class Order: Sendable {
        private let fired = StateLock<[(tag: Int, index: Int, deadline: Int64)]>([])
        func record(_ tag: Int, _ index: Int, _ deadline: Int64) {
            fired.withLock { $0.append((tag, index, deadline)) }
        }
        var all: [(tag: Int, index: Int, deadline: Int64)] { fired.withLock { $0 } }
    }

    /// Arms, on two new threads whose shards differ, `counts[t]` entries far in
    /// the future, then moves them (they stay in their shards), in order, to the
    /// deadlines `deadlines(t, i)`; returns the entries and the shards they sit in.
    /// Arming far first and moving after keeps the setup out of the race with
    /// the deadlines however slow the threads are to start.
    private func armOnTwoShards(
        _ engine: TimerEngine, order: Order, counts: [Int], deadlines: (Int, Int, Int64) -> Int64
    ) async -> (entries: [[RecordingEntry]], shards: Set<Int>) {
        var entries: [[RecordingEntry]] = []
        var shards = Set<Int>()
        let far = engine.nowTicks + 3_600_000_000_000
        for tag in 0..<2 {
            var armed: (entries: [RecordingEntry], shard: Int)? = nil
            for _ in 0..<64 where armed == nil {
                // Threads are dealt shards round-robin: a new thread soon has another shard.
                let taken = shards
                armed = await onOwnThread { () -> (entries: [RecordingEntry], shard: Int)? in
                    let shard = ThreadIdentity.shard() & (engine.shardCount - 1)
                    guard !taken.contains(shard) else { return nil }
                    let entries = (0..<counts[tag]).map { index in
                        let entry = RecordingEntry("\(tag).\(index)") { _, deadline in
                            order.record(tag, index, deadline)
                        }
                        entry.arm(engine, at: far)
                        return entry
                    }
                    return (entries, shard)
                }
            }
            entries.append(armed?.entries ?? [])
            if let armed { shards.insert(armed.shard) }
        }
        // 300 ms ahead: the moves take far less, so one wake-up finds it all due.
        let base = engine.nowTicks + 300_000_000
        for tag in 0..<2 {
            #expect(
                entries[tag].allSatisfy {
                    $0.timerSlot >> TimerEngine.shardShift == entries[tag][0].timerSlot >> TimerEngine.shardShift
                })
            for (index, entry) in entries[tag].enumerated() { entry.arm(engine, at: deadlines(tag, index, base)) }
        }
        return (entries, shards)
    }

    @Test("no entry fires after one with a later deadline from another shard, beyond the batch limit too")
    func deadlineOrderAcrossShardsBeyondBatchLimit() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let order = Order()
        // One wake-up finds everything due: 600 entries (more than the 256 one
        // shard gives per round) a nanosecond apart in one shard, and 10 a few
        // microseconds later in another.
        let (entries, shards) = await armOnTwoShards(engine, order: order, counts: [600, 10]) { tag, index, base in
            tag == 0 ? base + Int64(index) : base + 5_000 + Int64(index)
        }
        #expect(shards.count == 2, "the two threads did not get two shards")
        await eventually { order.all.count == entries.joined().count }
        let fired = order.all
        #expect(fired.count == 610)
        let outOfOrder = zip(fired, fired.dropFirst()).filter { $0.deadline > $1.deadline }.count
        #expect(outOfOrder == 0, "\(outOfOrder) entries fired after an entry with a later deadline")
        for tag in 0..<2 {
            let indices = fired.filter { $0.tag == tag }.map(\.index)
            #expect(indices == indices.sorted())
        }
        #expect(engine.pendingCount == 0)
    }

    @Test("entries one thread arms for the same instant fire in arming order, beyond the batch limit too")
    func tiesInArmingOrderWithinAThread() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let order = Order()
        let (entries, shards) = await armOnTwoShards(engine, order: order, counts: [600, 300]) { _, _, base in base }
        #expect(shards.count == 2)
        await eventually { order.all.count == entries.joined().count }
        let fired = order.all
        #expect(fired.count == 900)
        for tag in 0..<2 {
            let indices = fired.filter { $0.tag == tag }.map(\.index)
            #expect(indices == Array(0..<(tag == 0 ? 600 : 300)), "thread \(tag)'s entries fired out of arming order")
        }
    }
}
