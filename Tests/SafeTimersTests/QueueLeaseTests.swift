import Dispatch
import Foundation
import Testing

@testable import SafeTimers

/// A primitive made for a queue counts references to its thread's lease on that
/// queue, not to the queue (see `QueueLease`): the handler still runs on that
/// queue, the queue lives while anything needs it, and it is released once the
/// thread has moved on to another queue.
@Suite("Queue leases")
struct QueueLeaseTests {
    @Test("one thread keeps one lease per queue for its last four queues; a fifth replaces the oldest")
    func leasePerThreadAndQueue() {
        let queues = (0..<5).map { DispatchQueue(label: "lease.\($0)") }
        let first = QueueLease.current(for: .passUnretained(queues[0]))
        #expect(QueueLease.current(for: .passUnretained(queues[0])) === first)
        #expect(first.queue === queues[0])
        let four = queues[0..<4].map { QueueLease.current(for: .passUnretained($0)) }
        #expect(four[0] === first)
        // Alternating among four queues makes no new lease.
        for _ in 0..<3 {
            for (queue, lease) in zip(queues[0..<4], four) {
                #expect(QueueLease.current(for: .passUnretained(queue)) === lease)
            }
        }
        let fifth = QueueLease.current(for: .passUnretained(queues[4]))
        #expect(fifth.queue === queues[4])
        #expect(QueueLease.current(for: .passUnretained(queues[1])) === four[1])
        #expect(QueueLease.current(for: .passUnretained(queues[0])) !== first)  // the oldest was replaced
        #expect(first.queue === queues[0])  // a lease held elsewhere keeps its queue
    }

    @Test("threads scheduling on one queue run their works there, and the queue is released after")
    func handlersRunOnTheLeasedQueue() {
        let key = DispatchSpecificKey<Int>()
        weak var released: DispatchQueue?
        let ranOnQueue = Counter()
        let done = DispatchSemaphore(value: 0)
        do {
            let queue = DispatchQueue(label: "lease.shared")
            queue.setSpecific(key: key, value: 7)
            released = queue
            let threads = (0..<4).map { _ in
                Thread {
                    for _ in 0..<25 {
                        _ = DelayedWork.schedule(after: .milliseconds(1), on: queue) {
                            if DispatchQueue.getSpecific(key: key) == 7 { ranOnQueue.increment() }
                            done.signal()
                        }
                    }
                    // The thread ends here, and its leases with it.
                }
            }
            for thread in threads { thread.start() }
            for _ in 0..<100 { #expect(done.wait(timeout: .now() + 30) == .success) }
        }
        #expect(ranOnQueue.count == 100)
        waitUntil { released == nil }
        #expect(released == nil, "the queue outlived its works and every thread's lease")
    }
}
