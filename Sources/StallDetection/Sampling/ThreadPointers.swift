import CStallCapture
import Synchronization

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
    /// A thread's task (0: none; nil: not read) and the thread pointer it was
    /// read through.
    typealias TaskRead = (task: UInt?, pointer: UInt?)

    /// At most this many threads are remembered; the table is emptied when full.
    static let limit = 4_096

    /// The table, and its generation: 1 at first, one more each time it is
    /// emptied (never 0, which a thread's mark holds before its first record).
    private static let table = Locked<(pointers: [Int32: UInt], generation: UInt32)>(([:], 1))
    /// The table's generation, read without its lock by threads that recorded
    /// their pointer before.
    private static let generation = Atomic<UInt32>(1)

    /// Remembers the calling thread's pointer (a probe's answer). A thread that
    /// recorded it in the table's current generation returns at once: its mark
    /// (`stallcapture_thread_mark`) says so, with no lock taken.
    static func recordCurrent() {
        guard stallcapture_thread_mark() != generation.load(ordering: .acquiring) else { return }
        let recordedIn = record(UInt(stallcapture_thread_pointer()), of: stallcapture_current_tid())
        stallcapture_set_thread_mark(recordedIn)
    }

    /// Remembers `pointer` as thread `thread`'s; returns the table's generation.
    @discardableResult
    private static func record(_ pointer: UInt, of thread: Int32) -> UInt32 {
        table.withLock { table -> UInt32 in
            if table.pointers[thread] != pointer {
                if table.pointers.count >= limit {
                    table.pointers.removeAll(keepingCapacity: true)
                    table.generation = table.generation == .max ? 1 : table.generation + 1
                    generation.store(table.generation, ordering: .releasing)
                }
                table.pointers[thread] = pointer
            }
            return table.generation
        }
    }

    /// The queue thread `thread` drains now (0: none), if it can be read.
    static func currentQueue(of thread: Int32) -> UInt? {
        guard let pointer = table.withLock({ $0.pointers[thread] }) else { return nil }
        var queue: UInt = 0
        guard stallcapture_queue_of_thread(thread, pointer, &queue) == 1 else { return nil }
        return queue
    }

    /// The Swift task of a thread asleep that never answered a probe (a fresh
    /// process's first stall, a `queue.sync` called from a task), and its
    /// pointer, found in a copy of its stack (`words`, read from `sp` up) and
    /// remembered. glibc keeps a thread's descriptor at the top of the stack it
    /// allocated, above the static TLS blocks, and on x86_64 the thread pointer
    /// is the descriptor's address, whose first and third words (`tcb`, `self`)
    /// hold that address again; a candidate is taken only when the descriptor
    /// holds the thread's id too (``currentTask(of:)``). A stack the copy did not
    /// reach the top of (`reachedTop` false: the copy stopped at its limit), or
    /// one the program allocated itself, gives nil. A whole stack without a
    /// descriptor (the main thread's: its descriptor is in the static TLS area)
    /// is not searched again while its thread sleeps in the same megabyte.
    static func findTask(
        of thread: Int32, stack words: UnsafeBufferPointer<UInt>, at sp: UInt, reachedTop: Bool
    ) -> TaskRead {
        #if arch(x86_64) && os(Linux)
        let searched = UInt64(UInt32(bitPattern: thread)) << 32 | UInt64(truncatingIfNeeded: sp >> 20)
        guard !withoutDescriptor.withLock({ $0.contains(searched) }) else { return (nil, nil) }
        let wordSize = UInt(MemoryLayout<UInt>.size)
        // From the top down: the descriptor lies above every frame.
        var index = words.count - 3
        while index >= 0 {
            let address = sp &+ UInt(index) &* wordSize
            if words[index] == address && words[index + 2] == address {
                var task: UInt = 0
                if stallcapture_task_of_thread(thread, address, &task) == 1 {
                    record(address, of: thread)
                    return (task, address)
                }
            }
            index -= 1
        }
        if reachedTop {
            withoutDescriptor.withLock { stacks in
                if stacks.count >= limit { stacks.removeAll(keepingCapacity: true) }
                stacks.insert(searched)
            }
        }
        #endif
        return (nil, nil)
    }

    /// Stacks searched whole without a descriptor: a thread's id and its stack
    /// pointer's megabyte (a thread that reuses the id has a stack elsewhere).
    private static let withoutDescriptor = Locked<Set<UInt64>>([])

    /// The Swift task thread `thread` runs now (0: none), if it can be read,
    /// and the thread's pointer it was read through.
    static func currentTask(of thread: Int32) -> TaskRead {
        guard let pointer = table.withLock({ $0.pointers[thread] }) else { return (nil, nil) }
        var task: UInt = 0
        guard stallcapture_task_of_thread(thread, pointer, &task) == 1 else { return (nil, pointer) }
        return (task, pointer)
    }
}
