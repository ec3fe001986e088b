import CStallCapture

/// Teaches the `SIGPROF` handler where a sampled thread's stack is mapped, so
/// that its next samples copy the stack with plain loads instead of
/// `process_vm_readv`.
///
/// Every `process_vm_readv` takes the process' memory-map lock for reading. A
/// thread preempted inside one in its handler (an event loop's thread at nice 19
/// on a busy machine waits hundreds of milliseconds for a core) keeps the lock;
/// the next `mmap`, `munmap` or `mprotect` of any thread waits for it, and every
/// page fault and memory read of every other thread queues behind that writer.
/// Sampling one starved thread then stopped the whole process, the detector's
/// own threads and the other targets' with it.
///
/// After a sample copied through the kernel, the range of the thread's stack
/// is learned for that thread (its thread id and thread pointer) from the
/// mapping in `/proc/self/maps` that holds its stack pointer, when the thread
/// cannot lose that range while it runs: the mapping also holds the thread
/// pointer (a glibc thread's stack block, or a stack the program gave
/// `pthread_attr_setstack`: glibc puts the thread's control block at its top),
/// and the range ends at the thread pointer, below which lie the stack and the
/// thread-local storage; or the mapping is the main thread's `[stack]`, whose
/// top never moves. A thread on another stack (an alternate signal stack, a
/// coroutine's elsewhere) keeps the kernel's copy. A thread that answered a
/// probe learned its range itself (`stallcapture_learn_own_stack`); any other
/// thread's mapping is looked up once: the lookups tried are remembered (4,096
/// at most, then forgotten together).
enum StackMappings {
    private static let tried = Locked(Set<Tried>())
    private static let rememberedTries = 4_096

    private struct Tried: Hashable {
        let thread: Int32
        let threadPointer: UInt
    }

    /// After a sample of `thread` copied through the kernel: learns the mapping
    /// holding `stackPointer`, if it qualifies and was not looked up before.
    static func learn(thread: Int32, stackPointer: UInt, threadPointer: UInt) {
        guard thread > 0, stackPointer != 0, threadPointer != 0,
            stallcapture_knows_stack(thread, threadPointer) == 0
        else { return }
        let key = Tried(thread: thread, threadPointer: threadPointer)
        let first = tried.withLock { tried in
            if tried.count >= rememberedTries { tried.removeAll() }
            return tried.insert(key).inserted
        }
        guard first, let maps = ProcFile.read("/proc/self/maps"),
            let mapping = mapping(in: maps, holding: stackPointer, threadPointer: threadPointer)
        else { return }
        stallcapture_learn_stack(thread, threadPointer, mapping.lowerBound, mapping.upperBound)
    }

    /// The stack range of a thread at `stackPointer` with `threadPointer`:
    /// from the start of the readable mapping of `maps` (the text of
    /// `/proc/self/maps`) that holds the stack pointer to the thread pointer,
    /// when the mapping holds both; the whole mapping when it is the `[stack]`.
    static func mapping(in maps: String, holding stackPointer: UInt, threadPointer: UInt) -> Range<UInt>? {
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 2, fields[1].first == "r" else { continue }
            let bounds = fields[0].split(separator: "-")
            guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16),
                start < end, (start..<end).contains(stackPointer)
            else { continue }
            let isMainStack = fields.count >= 6 && fields[5] == "[stack]"
            if isMainStack { return start..<end }
            return (stackPointer..<end).contains(threadPointer) ? start..<threadPointer : nil
        }
        return nil
    }
}
