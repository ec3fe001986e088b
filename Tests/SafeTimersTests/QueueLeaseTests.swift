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
    @Test("one thread gets one lease per queue, and a new lease when it gives another queue")
    func leasePerThreadAndQueue() {
        let first = DispatchQueue(label: "lease.first")
        let second = DispatchQueue(label: "lease.second")
        let a = QueueLease.current(for: first)
        let b = QueueLease.current(for: first)
        #expect(a === b)
        #expect(a.queue === first)
        let c = QueueLease.current(for: second)
        #expect(c !== a)
        #expect(c.queue === second)
        #expect(a.queue === first)  // a lease held elsewhere keeps its queue
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
                    // Moving on to another queue gives up this thread's lease on `queue`.
                    DelayedWork.schedule(after: .zero, on: DispatchQueue(label: "lease.other")) {}.cancel()
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
