import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Samples another thread's stack without changing what it does:
///
/// - A thread that sleeps in the kernel (state S or D in `/proc/self/task/TID/stat`)
///   is read without a signal: `/proc/self/task/TID/syscall` gives its stack pointer
///   and program counter, and `process_vm_readv` copies its stack (a read that
///   cannot fault). The thread's scheduling counts (`schedstat`) are read again
///   after the copy; if they changed, the thread ran meanwhile and the sample is
///   retaken, and a thread that ran during two copies is signalled. (The
///   syscall line, compared where the kernel keeps no such counts, misses a
///   thread that woke and slept again at the same place, as a loop of short
///   sleeps or an event loop does: its copy mixed the frames it ran meanwhile
///   with the sleeping ones, and an unwind of it showed stale frames as
///   certain.)
/// - Only a thread that runs user code gets `SIGPROF`: the C handler in
///   `CStallCapture` copies its registers, glibc's unwind and its stack.
///
/// Not thread-safe: one sampler belongs to one detector's thread.
final class StackSampler {
    enum Outcome {
        case copied(StackCopy, signalled: Bool)
        case unavailable(String)
        /// The thread runs, but gave no stack (it blocks the signal, or did not
        /// answer it in time).
        case runningUnsampled(String)
    }

    /// How much of a sleeping thread's stack is copied: the same as a signal
    /// sample (256 KB: over 2,000 frames of a typical Swift recursion).
    static let kernelCopyBytes = Int(STALLCAPTURE_STACK_BYTES)

    private let sample: UnsafeMutablePointer<stallcapture_sample>
    private let timeoutMilliseconds: Int32
    private var buffer: [UInt]
    /// The sampled threads' `stat` and `syscall` files, kept open.
    let files = ProcTaskFiles()

    init(timeout: Duration) {
        sample = .allocate(capacity: 1)
        // Every page touched now, on the detector's thread: the handler's first
        // write to a page of a new mapping would fault and take the memory-map
        // lock on the sampled thread, which may wait for a core while it holds it.
        UnsafeMutableRawPointer(sample).initializeMemory(
            as: UInt8.self, repeating: 0, count: MemoryLayout<stallcapture_sample>.size)
        timeoutMilliseconds = Int32(clamping: Monotonic.nanoseconds(timeout) / 1_000_000)
        buffer = [UInt](repeating: 0, count: Self.kernelCopyBytes / MemoryLayout<UInt>.size)
    }

    deinit {
        sample.deallocate()
    }

    /// Installs the process-wide signal handler; returns an error text on failure.
    static func install() -> String? {
        let result = stallcapture_install()
        return result == 0 ? nil : "cannot install the SIGPROF handler (errno \(result))"
    }

    /// Samples thread `tid`; of a thread asleep in the kernel, at most
    /// `kernelCopyLimit` bytes of stack are copied (a signal sample copies
    /// ``kernelCopyBytes``), and the pairs of async `contexts` (the last
    /// sample's chain) are read with it (``StackCopy/contextPairs``).
    func capture(thread tid: Int32, kernelCopyLimit: Int = kernelCopyBytes, contexts: [UInt] = []) -> Outcome {
        #if !os(Linux)
        // Apple platforms: no sampler yet (the design it will follow is in the
        // article "Detecting hangs and stalls"); nothing here reads `/proc`.
        return .unavailable(SamplingSupport.unavailableReason)
        #else
        var looks = Looks()
        while looks.taken < 3 + looks.blocked {
            looks.taken += 1
            guard let (state, blocked) = files.state(thread: tid) else { return .unavailable(unreadable(tid)) }
            // A thread that exited (under `dispatchMain()` the main thread calls
            // `pthread_exit`) stays listed as a zombie with a stale stack.
            if state == "Z" || state == "X" { return .unavailable("thread \(tid) has exited") }
            let outcome =
                state == "R"
                ? lookRunning(tid, blocksSignal: blocked & (1 << UInt32(SIGPROF - 1)) != 0, &looks)
                : lookAsleep(tid, kernelCopyLimit: kernelCopyLimit, contexts: contexts, &looks)
            if let outcome { return outcome }
        }
        // It fell asleep and woke again look after look: its handler copies a
        // stack that holds still.
        return captureBySignal(tid)
        #endif
    }

    /// What the looks of one ``capture(thread:kernelCopyLimit:contexts:)`` found
    /// so far: each look that found the signal blocked (or the thread answering
    /// another detector's request) allows one more.
    private struct Looks {
        var taken = 0
        var blocked = 0
        var answering = 0
        var ranWhileCopied = 0
    }

    /// A look at a running thread: signalled, unless it blocks `SIGPROF`. Nil:
    /// look again.
    private func lookRunning(_ tid: Int32, blocksSignal: Bool, _ looks: inout Looks) -> Outcome? {
        if blocksSignal && stallcapture_is_answering(tid) != 0 { return waitWhileAnswering(tid, &looks) }
        guard blocksSignal else { return captureBySignal(tid) }
        // A thread that blocks the signal would leave the sample to time out (the
        // signal time-out, each time: a detector's looks fell behind). The mask
        // is looked at again shortly first: a thread still returning from the
        // last sample's handler (which runs with SIGPROF blocked) or starting up
        // (glibc blocks every signal meanwhile) blocks it for microseconds only.
        // A thread inside the handler (a handler installed before this one runs
        // there too) or on its way out of it, preempted, is looked at for as
        // long as one answering (about 50 ms).
        looks.blocked += 1
        let inHandler = stallcapture_in_handler(tid, Self.handlerExitMilliseconds) != 0
        if looks.blocked < (inHandler ? 9 : 4) {
            usleep(UInt32(100) << looks.blocked)  // 0.2, 0.4, 0.8 ms (… 25.6 ms)
            return nil
        }
        if inHandler { return .runningUnsampled(Self.insideHandler(tid)) }
        return .runningUnsampled("thread \(tid) runs with SIGPROF blocked, so it is not signalled")
    }

    /// A look at a thread asleep: its stack copied through the kernel. Asleep
    /// inside the handler: checked before the copy and after it (it may have
    /// entered the handler meanwhile). Nil: look again.
    private func lookAsleep(_ tid: Int32, kernelCopyLimit: Int, contexts: [UInt], _ looks: inout Looks) -> Outcome? {
        if stallcapture_is_answering(tid) != 0 { return waitWhileAnswering(tid, &looks) }
        switch captureFromKernel(tid, limit: kernelCopyLimit, contexts: contexts) {
        case .copied where stallcapture_is_answering(tid) != 0: return waitWhileAnswering(tid, &looks)
        case .copied(let copy): return .copied(copy, signalled: false)
        case .refused(let reason): return .unavailable(reason)
        case .notAsleep where files.lastOpenError != 0: return .unavailable(unreadable(tid))
        case .notAsleep: return nil  // it woke up while being read; look again
        case .ranWhileCopied:
            // A thread that ran during two copies (short sleeps, an event loop
            // woken often) is signalled: its handler copies a stack that holds
            // still, at the cost of cutting a sleep short.
            looks.ranWhileCopied += 1
            return looks.ranWhileCopied >= 2 ? captureBySignal(tid) : nil
        }
    }

    /// A thread inside the handler answering another detector's request ran
    /// user code when the signal came: its stack read from outside would be the
    /// handler's, and it blocks SIGPROF meanwhile. It is looked at again once it
    /// is back: at 0.2 ms, then twice as long each time (about 50 ms in all; a
    /// thread preempted inside the handler on a busy machine stays there for a
    /// time slice or more). Nil: look again.
    private func waitWhileAnswering(_ tid: Int32, _ looks: inout Looks) -> Outcome? {
        guard looks.answering < 8 else { return .runningUnsampled(Self.busyAnswering(tid)) }
        usleep(UInt32(200) << UInt32(looks.answering))
        looks.answering += 1
        looks.blocked += 1
        return nil
    }

    /// How long after leaving the SIGPROF handler a thread that shows the signal
    /// blocked is taken to be still on its way out (a time slice and more).
    static let handlerExitMilliseconds: UInt32 = 20

    /// Why a thread that showed SIGPROF blocked inside or just out of the
    /// handler was not sampled: it stayed so for every look (about 50 ms).
    private static func insideHandler(_ tid: Int32) -> String {
        "thread \(tid) was inside the SIGPROF handler (the detector's or one it calls) for every look"
    }

    /// Why a thread inside the handler, answering another detector's sample, was
    /// not sampled: it stayed there for every look (about 50 ms).
    private static func busyAnswering(_ tid: Int32) -> String {
        "thread \(tid) was answering another detector's sample for every look"
    }

    /// Why thread `tid`'s `/proc` files could not be read: no descriptor left,
    /// `/proc` itself unreadable (not mounted, or not permitted), or the thread
    /// gone (its directory missing while `/proc/self/task` opens).
    private func unreadable(_ tid: Int32) -> String {
        if files.lastFailure != 0 {
            return "thread \(tid) cannot be read: the process has no file descriptor left "
                + "(\(files.lastFailure == EMFILE ? "EMFILE" : "ENFILE"))"
        }
        let taskDirectory = ProcTaskFiles.taskDirectoryError()
        if taskDirectory != 0 {
            return "thread \(tid) cannot be sampled: /proc is unreadable "
                + "(/proc/self/task: \(Self.errorName(taskDirectory)))"
        }
        if files.lastOpenError != 0 && files.lastOpenError != ENOENT && files.lastOpenError != ESRCH {
            return "thread \(tid) cannot be sampled: /proc/self/task/\(tid) is unreadable "
                + "(\(Self.errorName(files.lastOpenError)))"
        }
        return "thread \(tid) is gone"
    }

    /// The symbolic name of the errno values a sample can meet, else "errno N".
    static func errorName(_ error: Int32) -> String {
        switch error {
        case EPERM: "EPERM"
        case ENOENT: "ENOENT"
        case ESRCH: "ESRCH"
        case EACCES: "EACCES"
        case EFAULT: "EFAULT"
        case ENOSYS: "ENOSYS"
        case EIO: "EIO"
        default: "errno \(error)"
        }
    }

    /// Why nothing of thread `tid`'s stack at `sp` could be copied.
    static func copyRefused(_ tid: Int32, sp: UInt, error: Int32) -> String {
        if error == EPERM || error == ENOSYS {
            return "cannot read thread \(tid)'s stack: process_vm_readv refused (\(errorName(error)))"
        }
        return "cannot read thread \(tid)'s stack at 0x\(String(sp, radix: 16)) "
            + "(process_vm_readv: \(errorName(error)))"
    }

    private enum KernelCapture {
        case copied(StackCopy)
        /// Nothing of the stack could be copied: the reason.
        case refused(String)
        /// Not asleep in the kernel.
        case notAsleep
        /// It ran while its stack was copied (and may sleep again).
        case ranWhileCopied
    }

    /// Reads a thread that sleeps in the kernel, and the pairs of `contexts`
    /// while it holds still.
    private func captureFromKernel(_ tid: Int32, limit: Int, contexts: [UInt]) -> KernelCapture {
        // Nil both times where the kernel keeps no scheduler statistics.
        let ranBefore = files.read(.schedstat, thread: tid)
        guard let before = files.read(.syscall, thread: tid), let (sp, pc) = Self.parseSyscall(before) else {
            return .notAsleep
        }
        let limitWords = max(1, min(buffer.count, limit / MemoryLayout<UInt>.size))
        let readAt = Monotonic.now()
        // Its task, between the two readings too.
        var (task, threadPointer) = ThreadPointers.currentTask(of: tid)
        let (copiedWords, error) = buffer.withUnsafeMutableBytes { bytes in
            Self.copyMemoryNotingError(
                from: sp,
                into: UnsafeMutableRawBufferPointer(rebasing: bytes[..<(limitWords * MemoryLayout<UInt>.size)]))
        }
        if threadPointer == nil && copiedWords >= 3 {
            (task, threadPointer) = buffer.withUnsafeBufferPointer { words in
                ThreadPointers.findTask(
                    of: tid, stack: UnsafeBufferPointer(rebasing: words[..<copiedWords]), at: sp,
                    reachedTop: copiedWords < limitWords)
            }
        }
        let pairs = contexts.isEmpty ? nil : Self.readPairs(at: contexts)?.pairs
        // Unchanged scheduling counts say the thread did not run meanwhile;
        // without them, an unchanged syscall line says it is still in the same
        // sleep, or in another just like it.
        let still =
            ranBefore.map { files.read(.schedstat, thread: tid) == $0 } ?? (files.read(.syscall, thread: tid) == before)
        guard still else { return files.lastOpenError == 0 ? .ranWhileCopied : .notAsleep }
        if copiedWords == 0 { return .refused(Self.copyRefused(tid, sp: sp, error: error)) }
        // A whole copy shares the buffer (no 256 KB copy per sample); the copy is
        // gone again before the next capture writes to the buffer.
        return .copied(
            StackCopy(
                pc: pc, sp: sp, fp: nil,
                words: copiedWords == buffer.count ? buffer : Array(buffer.prefix(copiedWords)),
                truncated: copiedWords == limitWords, time: readAt, scheduling: ranBefore, task: task,
                threadPointer: threadPointer, contextPairs: pairs.map { (contexts, $0) }))
    }

    /// The thread's scheduling counts now (`schedstat`: they change whenever
    /// it runs); nil where the kernel keeps none.
    func scheduling(of tid: Int32) -> String? {
        files.read(.schedstat, thread: tid)
    }

    /// The stack pointer and program counter of a thread blocked in the kernel, from
    /// a `/proc/…/syscall` line: "nr arg1 … arg6 sp pc", or "-1 sp pc" when it is
    /// blocked outside a system call; nil for "running".
    static func parseSyscall(_ line: String) -> (sp: UInt, pc: UInt)? {
        let fields = line.split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard fields.count >= 3, fields[0] != "running" else { return nil }
        func hex(_ field: Substring) -> UInt? {
            UInt(field.hasPrefix("0x") ? field.dropFirst(2) : field, radix: 16)
        }
        guard let sp = hex(fields[fields.count - 2]), let pc = hex(fields[fields.count - 1]), sp != 0, pc != 0
        else { return nil }
        return (sp, pc)
    }

    /// The two words at each address (`pairs[2i]`, `pairs[2i + 1]`), read
    /// through the kernel in one system call, between two readings of the
    /// `between` words (`before`, `after`; empty without): Linux copies a
    /// call's ranges in the order given, each one whole before the next
    /// (`process_vm_rw_core`), so `before` was read before every pair and
    /// `after` after them. Nil when any is unreadable or not word-aligned.
    /// Consecutive addresses near each other (async contexts, which the task
    /// allocator packs into slabs) are read as one range (each address within
    /// a page of the range so far, 64 KB at most): the kernel's cost is about
    /// 1 µs a range, and a 50-await chain spans two or three slabs.
    static func readPairs(
        at addresses: [UInt], between span: (address: UInt, words: Int)? = nil
    ) -> (pairs: [UInt], before: [UInt], after: [UInt])? {
        let wordSize = UInt(MemoryLayout<UInt>.size)
        let spanWords = max(0, span?.words ?? 0)
        var remote: [iovec] = []
        remote.reserveCapacity(8)
        // The ranges' first positions among `addresses`, then the pairs' ranges.
        var starts: [Int] = []
        var (low, high) = (UInt(0), UInt(0))
        for (position, address) in addresses.enumerated() {
            guard address % wordSize == 0, address <= UInt.max - 2 * wordSize else { return nil }
            let (newLow, newHigh) = (min(low, address), max(high, address + 2 * wordSize))
            if !starts.isEmpty, address + 4_096 > low, address < high + 4_096, newHigh - newLow <= 65_536 {
                (low, high) = (newLow, newHigh)
                continue
            }
            if !starts.isEmpty { remote.append(Self.range(low, high)) }
            (low, high) = (address, address + 2 * wordSize)
            starts.append(position)
        }
        if !starts.isEmpty { remote.append(Self.range(low, high)) }
        if let span {
            guard spanWords > 0, span.address % wordSize == 0, span.address <= UInt.max - UInt(spanWords) * wordSize
            else { return nil }
            let words = Self.range(span.address, span.address + UInt(spanWords) * wordSize)
            remote = [words] + remote + [words]
        }
        guard remote.count <= 1_024 else { return nil }
        let total = remote.reduce(0) { $0 + $1.iov_len } / Int(wordSize)
        var buffer = [UInt](repeating: 0, count: total)
        let complete = buffer.withUnsafeMutableBytes { bytes in
            var offset = 0
            var local = remote.map { range in
                defer { offset += range.iov_len }
                return iovec(iov_base: bytes.baseAddress! + offset, iov_len: range.iov_len)
            }
            return readAtOnce(local: &local, remote: &remote) == bytes.count
        }
        guard complete else { return nil }
        var pairs = [UInt](repeating: 0, count: addresses.count * 2)
        var offset = spanWords
        for (index, first) in starts.enumerated() {
            let range = remote[span == nil ? index : index + 1]
            let rangeLow = UInt(bitPattern: range.iov_base)
            for position in first..<(index + 1 < starts.count ? starts[index + 1] : addresses.count) {
                let word = offset + Int((addresses[position] - rangeLow) / wordSize)
                (pairs[2 * position], pairs[2 * position + 1]) = (buffer[word], buffer[word + 1])
            }
            offset += range.iov_len / Int(wordSize)
        }
        return (pairs, Array(buffer[0..<spanWords]), Array(buffer[(total - spanWords)...]))
    }

    /// The remote range from `low` to `high`.
    private static func range(_ low: UInt, _ high: UInt) -> iovec {
        iovec(iov_base: UnsafeMutableRawPointer(bitPattern: low), iov_len: Int(high - low))
    }

    /// Copies the `remote` ranges into the `local` ones in one system call (at
    /// most 1,024 of them, Linux's `IOV_MAX`); the bytes copied (fewer when any
    /// is unreadable).
    private static func readAtOnce(local: inout [iovec], remote: inout [iovec]) -> Int {
        #if os(Linux)
        process_vm_readv(getpid(), &local, UInt(local.count), &remote, UInt(remote.count), 0)
        #else
        -1
        #endif
    }

    /// Copies memory of this process through the kernel, stopping at the first
    /// unmapped page instead of faulting. Returns the number of words copied.
    static func copyMemory(from address: UInt, into bytes: UnsafeMutableRawBufferPointer) -> Int {
        copyMemoryNotingError(from: address, into: bytes).words
    }

    /// ``copyMemory(from:into:)``, and the errno of its first failed read (0
    /// when none failed): EPERM or ENOSYS when the kernel refuses the call (a
    /// seccomp filter), EFAULT where the mapping ends.
    static func copyMemoryNotingError(
        from address: UInt, into bytes: UnsafeMutableRawBufferPointer
    ) -> (words: Int, error: Int32) {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        var total = 0
        var firstError: Int32 = 0
        func read(_ length: Int) -> Bool {
            #if os(Linux)
            var local = iovec(iov_base: bytes.baseAddress! + total, iov_len: length)
            var remote = iovec(iov_base: UnsafeMutableRawPointer(bitPattern: address + UInt(total)), iov_len: length)
            let copied = process_vm_readv(getpid(), &local, 1, &remote, 1, 0)
            if copied != length && firstError == 0 { firstError = copied < 0 ? errno : EFAULT }
            return copied == length
            #else
            // No cross-process read here: a sleeping thread's stack is not copied
            // (its report falls back to what the signal sample gives).
            return false
            #endif
        }
        // Chunks that double in size (few system calls for a deep stack); a chunk
        // that fails is retried page by page, to find where the mapping ends.
        var chunk = page - Int(address % UInt(page))
        while total < bytes.count {
            chunk = min(chunk, bytes.count - total)
            if read(chunk) {
                total += chunk
                chunk *= 2
                continue
            }
            var pageLength = min(page - Int((address &+ UInt(total)) % UInt(page)), bytes.count - total)
            while total < bytes.count && read(pageLength) {
                total += pageLength
                pageLength = min(page, bytes.count - total)
            }
            break
        }
        return (total / MemoryLayout<UInt>.size, firstError)
    }

    /// A SIGPROF handler as a report shows it: SIG_DFL, SIG_IGN, or its address.
    static func handlerName(_ handler: UInt) -> String {
        switch handler {
        case 0: "SIG_DFL"
        case 1: "SIG_IGN"
        default: "another, at 0x\(String(handler, radix: 16))"
        }
    }

    private func captureBySignal(_ tid: Int32) -> Outcome {
        var errorNumber: Int32 = 0
        let result = stallcapture_capture(tid, timeoutMilliseconds, sample, &errorNumber)
        switch Int(result) {
        case Int(STALLCAPTURE_OK):
            if sample.pointee.stack_size == 0 && sample.pointee.copy_error != 0 {
                return .unavailable(
                    Self.copyRefused(tid, sp: UInt(sample.pointee.sp), error: sample.pointee.copy_error))
            }
            let stackBytes = UnsafeRawBufferPointer(
                start: stallcapture_sample_stack(sample), count: Int(sample.pointee.stack_size))
            // Into the reused buffer (no 256 KB allocation per sample) when whole.
            let words: [UInt]
            if stackBytes.count == buffer.count * MemoryLayout<UInt>.size {
                buffer.withUnsafeMutableBytes { $0.copyMemory(from: stackBytes) }
                words = buffer
            } else {
                words = Array(stackBytes.bindMemory(to: UInt.self))
            }
            let copy = StackCopy(
                pc: UInt(sample.pointee.pc), sp: UInt(sample.pointee.sp), fp: UInt(sample.pointee.fp),
                words: words,
                // On an alternate signal stack the copy ends with that stack; the
                // thread's own lies elsewhere (the unwinder copies it when it
                // follows the signal frame there).
                truncated: Int(sample.pointee.stack_size) == Int(STALLCAPTURE_STACK_BYTES)
                    || sample.pointee.on_alternate_stack != 0,
                queue: sample.pointee.queue_known != 0 ? UInt(sample.pointee.queue) : nil,
                time: sample.pointee.time_ns > 0 ? sample.pointee.time_ns : nil,
                answerDelay: sample.pointee.time_ns > 0 && sample.pointee.sent_ns > 0
                    ? max(0, sample.pointee.time_ns - sample.pointee.sent_ns) : 0,
                task: sample.pointee.task_known != 0 ? UInt(sample.pointee.task) : nil,
                threadPointer: sample.pointee.thread_pointer == 0 ? nil : UInt(sample.pointee.thread_pointer))
            return .copied(copy, signalled: true)
        case Int(STALLCAPTURE_TIMEOUT):
            return .runningUnsampled("thread \(tid) did not answer within \(timeoutMilliseconds) ms")
        case Int(STALLCAPTURE_SIGNAL_FAILED):
            return .unavailable("cannot signal thread \(tid) (errno \(errorNumber))")
        case Int(STALLCAPTURE_UNSUPPORTED):
            return .unavailable(SamplingSupport.unavailableReason)
        case Int(STALLCAPTURE_HANDLER_REPLACED):
            return .runningUnsampled(
                "thread \(tid) runs user code and other code replaced the SIGPROF handler "
                    + "(now \(Self.handlerName(stallcapture_signal_handler(SIGPROF)))), so it is not signalled")
        default:
            return .unavailable("the SIGPROF handler is not installed")
        }
    }
}
