import Dispatch

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A thread's counted hold on the queue it last gave a primitive, which the
/// primitives it makes for that queue count references to instead of the queue.
///
/// A primitive keeps its handler's queue alive while it lives, and counting a
/// reference to a queue writes the queue's reference count: one cache line that
/// every thread making primitives for that queue shares, so two threads doing
/// so did less work than one. A lease is that thread's own object (the threads
/// share the queue, not the lease), counted by the primitives made on the
/// thread; it holds the queue.
///
/// Each thread keeps its last lease until it gives a primitive another queue,
/// or ends: a queue is released that much later.
final class QueueLease: Sendable {
    let queue: DispatchQueue

    private init(_ queue: DispatchQueue) { self.queue = queue }

    /// The calling thread's lease on `queue`, made and kept when the thread's
    /// lease is on another queue or it has none.
    @inline(__always)
    static func current(for queue: DispatchQueue) -> QueueLease {
        if let raw = pthread_getspecific(key) {
            let lease = Unmanaged<QueueLease>.fromOpaque(raw)
            if lease._withUnsafeGuaranteedRef({ $0.queue === queue }) { return lease.takeUnretainedValue() }
        }
        return replaceCurrent(with: queue)
    }

    @inline(never)
    private static func replaceCurrent(with queue: DispatchQueue) -> QueueLease {
        let lease = QueueLease(queue)
        let previous = pthread_getspecific(key)
        pthread_setspecific(key, Unmanaged.passRetained(lease).toOpaque())
        if let previous { Unmanaged<QueueLease>.fromOpaque(previous).release() }
        return lease
    }

    /// The thread-specific key; its destructor releases a thread's lease when
    /// the thread ends.
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let result = pthread_key_create(&key) { raw in
            #if canImport(Darwin)
            Unmanaged<QueueLease>.fromOpaque(raw).release()
            #else
            if let raw { Unmanaged<QueueLease>.fromOpaque(raw).release() }
            #endif
        }
        precondition(result == 0, "pthread_key_create failed: \(result)")
        return key
    }()
}
