import CStallCapture

/// The thread pointer (TLS base) of each thread seen answering a probe, by
/// kernel thread id: with it, the detector reads which dispatch queue a thread
/// drains now from libdispatch's thread-local record
/// (`stallcapture_queue_of_thread`), also for a thread asleep, whose stack is
/// read from `/proc` without a signal. A worker that ran this queue's probe
/// earlier and sleeps in another queue's job now is then told apart exactly, not
/// by the words its stack holds (stale copies of the queue's address were left
/// in a debug build's frames: another queue's function was blamed).
///
/// A thread that exited may have left its id to a new thread: the record read
/// holds the thread's id, and one that does not match is not used.
enum ThreadPointers {
    /// At most this many threads are remembered; the table is emptied when full.
    static let limit = 4_096

    private static let table = Locked<[Int32: UInt]>([:])

    /// Remembers the calling thread's pointer (a probe's answer).
    static func recordCurrent() {
        let thread = stallcapture_current_tid()
        let pointer = UInt(stallcapture_thread_pointer())
        table.withLock { table in
            guard table[thread] != pointer else { return }
            if table.count >= limit { table.removeAll(keepingCapacity: true) }
            table[thread] = pointer
        }
    }

    /// The queue thread `thread` drains now (0: none), if it can be read.
    static func currentQueue(of thread: Int32) -> UInt? {
        guard let pointer = table.withLock({ $0[thread] }) else { return nil }
        var queue: UInt = 0
        guard stallcapture_queue_of_thread(thread, pointer, &queue) == 1 else { return nil }
        return queue
    }
}
