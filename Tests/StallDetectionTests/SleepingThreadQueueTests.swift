import CStallCapture
import Dispatch
import Foundation
import SafeTimers
import Synchronization
import Testing

@testable import StallDetection

#if canImport(Glibc)
import Glibc
#endif

/// A thread asleep in a job is read from `/proc`, without a signal: which queue's
/// job it runs comes from libdispatch's own record of the thread, read through
/// the thread pointer its earlier probe answer left (``ThreadPointers``), so that
/// a worker that answered one queue's probe and now sleeps in another queue's job
/// is never taken for the first queue's (real time).
@Suite("The queue a sleeping thread drains (real time)")
struct SleepingThreadQueueTests {
    @Test("a worker asleep in queue B's job is read as B's, never as A's, whatever its stack's words hold")
    func sleepingWorkerIsReadAsItsQueue() throws {
        // The record's place is located when the handler is installed (a
        // detector's start).
        #expect(StackSampler.install() == nil)
        let queues = [DispatchQueue(label: "sleeping-queue.a"), DispatchQueue(label: "sleeping-queue.b")]
        let addresses = StateLock<[UInt]>([])
        for queue in queues { queue.sync { addresses.withLock { $0.append(stallcapture_current_queue()) } } }
        let (a, b) = addresses.withLock { ($0[0], $0[1]) }
        #expect(a != b && a != 0 && b != 0)
        let thread = Atomic<Int32>(0)
        let wake = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        queues[1].async {
            // A probe's answer on this worker, then A's address in this frame
            // (as a stale copy would be), then asleep in B's job until woken.
            _ = ProbeAnswer.here()
            withExtendedLifetime(a) {
                thread.store(stallcapture_current_tid(), ordering: .releasing)
                wake.wait()
            }
            finished.signal()
        }
        while thread.load(ordering: .acquiring) == 0 { usleep(1_000) }
        defer {
            wake.signal()
            finished.wait()
        }
        usleep(20_000)  // asleep in the semaphore by now
        let worker = thread.load(ordering: .acquiring)
        #expect(ThreadPointers.currentQueue(of: worker) == b)
        let context = SamplingContext()
        for _ in 0..<3 {
            for (watched, expected) in [(a, false), (b, true)] {
                guard case .stack(let raw) = context.sample(worker, queue: watched) else {
                    Issue.record("no stack of the sleeping worker")
                    continue
                }
                #expect(raw.currentQueue == b, "the queue read: \(String(describing: raw.currentQueue))")
                #expect(context.runsQueue(raw) == expected, "watching \(watched == a ? "A" : "B")")
            }
        }
    }

    @Test("a thread id no probe answer recorded has no queue read")
    func unknownThreadHasNoQueue() {
        #expect(ThreadPointers.currentQueue(of: Int32.max) == nil)
    }
}
