#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The two `/proc/self/task/TID/…` files a sample reads (`stat` for the thread's
/// state, `syscall` for a sleeping thread's stack pointer, twice), kept open per
/// thread and read again from offset 0: the kernel builds such a file anew for
/// each read at offset 0, and opening it by path was most of what capturing a
/// sleeping thread cost (a path walk, an allocation and a close, three times a
/// sample).
///
/// An open file stays bound to the thread it was opened for: once that thread has
/// exited its reads fail, and the path is opened again (a thread that reuses the
/// number is then found, as by path). Not thread-safe: it belongs to one
/// ``StackSampler``.
final class ProcTaskFiles {
    enum Kind: Int {
        case stat = 0
        case syscall = 1

        var name: String { self == .stat ? "stat" : "syscall" }
    }

    /// Threads whose files are kept open (two descriptors each); beyond it all are
    /// closed (a detector samples one thread per stall, a few when it searches
    /// for the blocked one). A thread found gone has its files closed at once.
    static let limit = 16
    private var descriptors: [Int32: [Int32]] = [:]
    private var buffer = [UInt8](repeating: 0, count: 4_096)
    /// Files opened by path (tests).
    private(set) var opens = 0
    /// Descriptors held now (tests).
    var openCount: Int { descriptors.values.reduce(0) { $0 + $1.filter { $0 >= 0 }.count } }

    deinit {
        closeAll()
    }

    func closeAll() {
        for pair in descriptors.values { for descriptor in pair where descriptor >= 0 { close(descriptor) } }
        descriptors.removeAll()
    }

    /// The file's whole text (up to 4 KB, far more than either holds), or nil
    /// when the thread is gone.
    func read(_ kind: Kind, thread tid: Int32) -> String? {
        for attempt in 0..<2 {
            guard let descriptor = descriptor(kind, thread: tid, reopen: attempt > 0) else { return nil }
            let count = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
            if count > 0 { return String(decoding: buffer[..<count], as: UTF8.self) }
        }
        return nil
    }

    /// The state letter from `stat` (R running, S sleeping, D uninterruptible, T
    /// stopped, Z zombie, …), or nil when the thread is gone. Found after the last
    /// `)` (the thread's name, between parentheses, may hold any byte).
    func stateLetter(thread tid: Int32) -> Character? {
        for attempt in 0..<2 {
            guard let descriptor = descriptor(.stat, thread: tid, reopen: attempt > 0) else { return nil }
            let letter = buffer.withUnsafeMutableBytes { bytes -> UInt8? in
                let count = pread(descriptor, bytes.baseAddress, bytes.count, 0)
                guard count > 0 else { return nil }
                guard let close = bytes[..<count].lastIndex(of: UInt8(ascii: ")")) else { return 0 }
                return bytes[(close + 1)..<count].first { $0 != UInt8(ascii: " ") } ?? 0
            }
            switch letter {
            case .none: continue
            case .some(0): return nil
            case .some(let byte): return Character(Unicode.Scalar(byte))
            }
        }
        return nil
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
            // Gone (or never there): nothing of it stays open.
            if let pair = descriptors.removeValue(forKey: tid) {
                for descriptor in pair where descriptor >= 0 { close(descriptor) }
            }
            return nil
        }
        descriptors[tid, default: [-1, -1]][kind.rawValue] = descriptor
        return descriptor
    }
}
