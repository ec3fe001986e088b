import CStallCapture
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import StallDetection

/// A probe that runs has ended the stall it answers: a sample of its thread
/// while it runs (waiting for a lock the detector holds, on a crowded machine,
/// where a report once showed `ThreadPointers.recordCurrent()` blocked in
/// `pthread_mutex_lock` as a 1.5 s stall's stack) is no stall's stack.
@Suite("A thread running a detector's probe (real time)")
struct ProbeRunTests {
    @Test("two reads of a probe record bracket a probe's run when either is odd or they differ")
    func bracketRule() {
        let thread: UInt64 = 1_234 << 32
        #expect(!SamplingContext.ranProbe(before: 0, after: 0), "no record")
        #expect(!SamplingContext.ranProbe(before: thread | 4, after: thread | 4), "ended before, not since")
        #expect(SamplingContext.ranProbe(before: thread | 5, after: thread | 5), "inside throughout")
        #expect(SamplingContext.ranProbe(before: thread | 4, after: thread | 6), "a whole run between")
        #expect(SamplingContext.ranProbe(before: 0, after: thread | 2), "first run, between")
        #expect(SamplingContext.ranProbe(before: thread | 4, after: thread | 5), "began between")
    }

    @Test("a thread inside a probe stays known as inside while a thread whose id shares its slot runs probes")
    func sharedSlot() throws {
        let inside = Atomic<Int32>(0)
        let release = DispatchSemaphore(value: 0)
        let holder = Thread {
            stallcapture_probe_begin()
            inside.store(stallcapture_current_tid(), ordering: .releasing)
            release.wait()
            stallcapture_probe_end()
        }
        holder.start()
        defer { release.signal() }
        while inside.load(ordering: .acquiring) == 0 { usleep(1_000) }
        let held = inside.load(ordering: .acquiring)
        // New threads until one's id falls on the holder's slot (ids count up).
        let collided = Atomic(false)
        for _ in 0..<5_000 where !collided.load(ordering: .acquiring) {
            let done = DispatchSemaphore(value: 0)
            let other = Thread {
                if stallcapture_current_tid() % 256 == held % 256 {
                    collided.store(true, ordering: .releasing)
                    stallcapture_probe_begin()
                    stallcapture_probe_end()
                    stallcapture_probe_begin()
                }
                done.signal()
            }
            other.start()
            done.wait()
        }
        let found = collided.load(ordering: .acquiring)
        try #require(found, "no thread id fell on the holder's slot in 5,000 threads")
        #expect(stallcapture_probe_mark(held) & 1 == 1, "the holder's record was overwritten")
    }

    @Test("a thread asleep inside a probe's run is sampled as a probe's; asleep outside one, as its own stack")
    func sleepingInsideAProbe() throws {
        #expect(StackSampler.install() == nil)
        let thread = Atomic<Int32>(0)
        let phase = Atomic<Int>(0)
        let wake = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let worker = Thread {
            thread.store(stallcapture_current_tid(), ordering: .releasing)
            stallcapture_probe_begin()
            phase.store(1, ordering: .releasing)
            wake.wait()  // a probe waiting for a lock
            stallcapture_probe_end()
            phase.store(2, ordering: .releasing)
            wake.wait()  // the target's own job
            done.signal()
        }
        worker.start()
        defer {
            wake.signal()
            wake.signal()
            done.wait()
        }
        let context = SamplingContext()
        while phase.load(ordering: .acquiring) != 1 { usleep(1_000) }
        usleep(20_000)
        let id = thread.load(ordering: .acquiring)
        guard case .detectorWork(let answeringProbe) = context.sample(id) else {
            Issue.record("a thread inside a probe's run was sampled as a target's")
            return
        }
        #expect(answeringProbe)
        #expect(context.backtrace(of: id).unavailableReason?.contains("running a detector's probe") == true)
        wake.signal()
        while phase.load(ordering: .acquiring) != 2 { usleep(1_000) }
        usleep(20_000)
        guard case .stack = context.sample(id) else {
            Issue.record("a thread past its probe's run was not sampled")
            return
        }
    }
}
