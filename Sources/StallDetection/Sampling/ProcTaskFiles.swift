#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The `/proc/self/task/TID/…` files a sample reads (`stat` for the thread's
/// state; `syscall` for a sleeping thread's stack pointer and `schedstat` for
/// whether it ran, each twice), kept open per thread and read again from offset
/// 0: the kernel builds such a file anew for each read at offset 0, and opening
/// it by path was most of what capturing a sleeping thread cost (a path walk,
/// an allocation and a close, three times a sample).
///
/// An open file stays bound to the thread it was opened for: once that thread has
/// exited its reads fail, and the path is opened again (a thread that reuses the
/// number is then found, as by path). Not thread-safe: it belongs to one
/// ``StackSampler``.
final class ProcTaskFiles {
    enum Kind: Int, CaseIterable {
        case stat = 0
        case syscall = 1
        /// The thread's time on a CPU, time waiting for one, and times scheduled:
        /// a line that changes whenever the thread runs.
        case schedstat = 2

        var name: String {
            switch self {
            case .stat: "stat"
            case .syscall: "syscall"
            case .schedstat: "schedstat"
            }
        }
    }

    /// Whether threads have a `schedstat` file (the kernel keeps scheduler
    /// statistics, `CONFIG_SCHED_INFO`); where not, reading it gives nil.
    static let hasSchedstat = access("/proc/self/schedstat", R_OK) == 0

    /// Threads whose files are kept open (three descriptors each); beyond it all are
    /// closed (a detector samples one thread per stall, a few when it searches
    /// for the blocked one). A thread found gone has its files closed at once.
    static let limit = 16
    private var descriptors: [Int32: [Int32]] = [:]
    private var buffer = [UInt8](repeating: 0, count: 4_096)
    /// Files opened by path (tests).
    private(set) var opens = 0
    /// `EMFILE` or `ENFILE` when the last open failed for want of a descriptor,
    /// else 0.
    private(set) var lastFailure: Int32 = 0
    /// The errno of the failed open in the last read (any cause), else 0: ENOENT for a
    /// thread that is gone, but also for `/proc` not mounted; EACCES when it is
    /// not readable.
    private(set) var lastOpenError: Int32 = 0
    /// Descriptors held now (tests).
    var openCount: Int { descriptors.values.reduce(0) { $0 + $1.filter { $0 >= 0 }.count } }

    deinit {
        closeAll()
    }

    func closeAll() {
        for pair in descriptors.values { for descriptor in pair where descriptor >= 0 { close(descriptor) } }
        descriptors.removeAll()
    }

    /// Closes every thread's files but `kept`'s (after a search over many threads).
    func closeAll(except kept: Int32?) {
        for (tid, pair) in descriptors where tid != kept {
            for descriptor in pair where descriptor >= 0 { close(descriptor) }
        }
        descriptors = descriptors.filter { $0.key == kept }
    }

    /// The file's whole text (up to 4 KB, far more than either holds), or nil
    /// when the thread is gone.
    func read(_ kind: Kind, thread tid: Int32) -> String? {
        contents(kind, thread: tid) { String(decoding: $0, as: UTF8.self) }
    }

    /// The state letter from `stat` (R running, S sleeping, D uninterruptible, T
    /// stopped, Z zombie, …), or nil when the thread is gone.
    func stateLetter(thread tid: Int32) -> Character? { state(thread: tid)?.letter }

    /// From `stat`: the state letter, and the thread's blocked signals 1…31 (bit
    /// `n - 1` for signal `n`: the field the kernel still fills, the first 31
    /// signals of `SigBlk`); nil when the thread is gone. Fields are counted
    /// after the last `)` (the thread's name, between parentheses, may hold any
    /// byte).
    func state(thread tid: Int32) -> (letter: Character, blocked: UInt32)? {
        let parsed = contents(.stat, thread: tid) { bytes -> (letter: Character, blocked: UInt32)? in
            guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
            // Fields after ")": state (field 3) … blocked (field 32).
            var field = 2
            var index = close + 1
            var letter: UInt8 = 0
            var blocked: UInt32 = 0
            while index < bytes.count && field < 32 {
                while index < bytes.count && bytes[index] == UInt8(ascii: " ") { index += 1 }
                guard index < bytes.count else { break }
                field += 1
                let start = index
                while index < bytes.count && bytes[index] != UInt8(ascii: " ") && bytes[index] != UInt8(ascii: "\n") {
                    index += 1
                }
                if field == 3 { letter = bytes[start] }
                if field == 32 {
                    var value: UInt64 = 0
                    for digit in bytes[start..<index] where digit >= 48 && digit <= 57 {
                        value = value &* 10 &+ UInt64(digit - 48)
                    }
                    blocked = UInt32(truncatingIfNeeded: value)
                }
            }
            return letter == 0 ? nil : (Character(Unicode.Scalar(letter)), blocked)
        }
        return parsed ?? nil
    }

    /// `body` applied to the file's bytes, read from offset 0 of the kept
    /// descriptor, or of a new one if that read fails (the thread it was opened
    /// for has exited); nil when the thread is gone.
    private func contents<Result>(
        _ kind: Kind, thread tid: Int32, _ body: (UnsafeRawBufferPointer) -> Result
    ) -> Result? {
        lastOpenError = 0
        if kind == .schedstat && !Self.hasSchedstat { return nil }
        for attempt in 0..<2 {
            guard let descriptor = descriptor(kind, thread: tid, reopen: attempt > 0) else { return nil }
            let result = buffer.withUnsafeMutableBytes { bytes -> Result? in
                let count = pread(descriptor, bytes.baseAddress, bytes.count, 0)
                return count > 0 ? body(UnsafeRawBufferPointer(rebasing: bytes[..<count])) : nil
            }
            if let result { return result }
        }
        return nil
    }

    /// Why this process' task directory cannot be opened (`/proc` not mounted:
    /// ENOENT; not readable: EACCES), or 0 when it can: a thread whose files are
    /// missing while it opens is gone.
    static func taskDirectoryError() -> Int32 {
        let descriptor = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { return errno == 0 ? EIO : errno }
        close(descriptor)
        return 0
    }

    private func descriptor(_ kind: Kind, thread tid: Int32, reopen: Bool) -> Int32? {
        if let pair = descriptors[tid], pair[kind.rawValue] >= 0 {
            if !reopen { return pair[kind.rawValue] }
            close(pair[kind.rawValue])
            descriptors[tid]?[kind.rawValue] = -1
        }
        if descriptors[tid] == nil && descriptors.count >= Self.limit { closeAll() }
        opens += 1
        let descriptor = open("/proc/self/task/\(tid)/\(kind.name)", O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            let error = errno
            lastOpenError = error
            if error == EMFILE || error == ENFILE {
                // Out of descriptors: the program needs them more than a cache.
                lastFailure = error
                closeAll()
            } else if let pair = descriptors.removeValue(forKey: tid) {
                // Gone (or never there): nothing of it stays open.
                for descriptor in pair where descriptor >= 0 { close(descriptor) }
            }
            return nil
        }
        lastFailure = 0
        lastOpenError = 0
        descriptors[tid, default: [Int32](repeating: -1, count: Kind.allCases.count)][kind.rawValue] = descriptor
        return descriptor
    }
}
