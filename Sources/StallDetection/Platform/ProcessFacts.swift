#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Facts about this process read from `/proc` (Linux); elsewhere the answers are
/// "unknown" and the rules that need them stay off.
enum ProcessFacts {
    /// The kernel id of the main thread (the process id).
    static var mainThreadID: Int32 { Int32(getpid()) }

    /// The CPU time all threads of this process have used, in nanoseconds
    /// (`CLOCK_PROCESS_CPUTIME_ID`: one system call, under a microsecond).
    static func cpuTime() -> Int64 {
        var time = timespec()
        guard clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time) == 0 else { return 0 }
        return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
    }

    /// A thread's time on a core and waiting on a run queue for one, in all, in
    /// nanoseconds: the first two fields of its `schedstat`.
    struct Schedule: Equatable, Sendable {
        var ran: Int64
        var waited: Int64
    }

    /// Thread `thread`'s ``Schedule`` (the calling thread's when nil); a wait
    /// still under way is added once the thread runs. Nil where the kernel keeps
    /// no such counts (no `CONFIG_SCHED_INFO`), or off Linux.
    static func schedule(ofThread thread: Int32?) -> Schedule? {
        #if os(Linux)
        guard let line = read(threadFile("schedstat", of: thread)) else { return nil }
        let fields = line.split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard fields.count >= 2, let ran = Int64(fields[0]), let waited = Int64(fields[1]) else { return nil }
        return Schedule(ran: ran, waited: waited)
        #else
        return nil
        #endif
    }

    /// Whether thread `thread` is runnable (state `R` in its `stat`: running,
    /// or waiting for a core); nil where it cannot be read, or off Linux.
    static func isRunnable(_ thread: Int32) -> Bool? {
        #if os(Linux)
        guard let fields = statFields(ofThread: thread) else { return nil }
        return fields.first == "R"
        #else
        return nil
        #endif
    }

    /// How long thread `thread` (the calling thread when nil) has existed, in
    /// nanoseconds: the boot-time clock less the thread's start time (field 22
    /// of its `stat`, in clock ticks since boot, so to 10 ms). Nil where it
    /// cannot be read, or off Linux.
    static func age(ofThread thread: Int32?) -> Int64? {
        #if os(Linux)
        guard let fields = statFields(ofThread: thread) else { return nil }
        let ticksPerSecond = Int64(sysconf(Int32(_SC_CLK_TCK)))
        // Field 3 (the state) is the first after the name: field 22 is the 20th.
        guard fields.count >= 20, let ticks = Int64(fields[19]), ticksPerSecond > 0 else { return nil }
        let start = ticks / ticksPerSecond * 1_000_000_000 + ticks % ticksPerSecond * 1_000_000_000 / ticksPerSecond
        return max(0, bootTimeNanoseconds() - start)
        #else
        return nil
        #endif
    }

    /// The path of thread `thread`'s `/proc` file `name` (the calling thread's when nil).
    private static func threadFile(_ name: String, of thread: Int32?) -> String {
        thread.map { "/proc/self/task/\($0)/\(name)" } ?? "/proc/thread-self/\(name)"
    }

    /// Thread `thread`'s `stat` fields from the third (the state) on. The name
    /// (field 2) is in parentheses and may hold spaces or ')': the fields are
    /// counted from the last ')'.
    private static func statFields(ofThread thread: Int32?) -> [Substring]? {
        guard let line = read(threadFile("stat", of: thread)), let close = line.lastIndex(of: ")") else { return nil }
        return line[line.index(after: close)...].split(separator: " ")
    }

    /// Whether a debugger (or any tracer) is attached: on Linux `TracerPid` in
    /// `/proc/self/status` is not 0; on Darwin `sysctl` `KERN_PROC_PID` sets
    /// `P_TRACED` in the process flags (Apple's technical Q&A QA1361).
    static func isTraced() -> Bool {
        #if canImport(Darwin)
        var info = kinfo_proc()
        var size = MemoryLayout<kinfo_proc>.stride
        var name: [Int32] = [CTL_KERN, KERN_PROC, KERN_PROC_PID, getpid()]
        let result = name.withUnsafeMutableBufferPointer { name in
            sysctl(name.baseAddress, u_int(name.count), &info, &size, nil, 0)
        }
        guard result == 0 else { return false }
        return info.kp_proc.p_flag & P_TRACED != 0
        #else
        guard let status = read("/proc/self/status") else { return false }
        for line in status.split(separator: "\n") where line.hasPrefix("TracerPid:") {
            return line.dropFirst("TracerPid:".count).trimmingCharacters(in: " \t") != "0"
        }
        return false
        #endif
    }

    /// The name of a directory entry `readdir` returned, read in place up to its
    /// terminating zero. (Copying the `d_name` field copies its declared 256
    /// bytes, past the end of a shorter entry: at the end of `readdir`'s buffer
    /// that read faulted.)
    static func entryName(_ entry: UnsafeMutablePointer<dirent>) -> String {
        let offset = MemoryLayout<dirent>.offset(of: \dirent.d_name) ?? 0
        return String(cString: UnsafeRawPointer(entry).advanced(by: offset).assumingMemoryBound(to: CChar.self))
    }

    /// The threads of this process with their names (`comm`).
    static func threads() -> [(id: Int32, name: String)] {
        guard let directory = opendir("/proc/self/task") else { return [] }
        defer { closedir(directory) }
        var result: [(Int32, String)] = []
        while let entry = readdir(directory) {
            guard let id = Int32(Self.entryName(entry)) else { continue }
            let comm = read("/proc/self/task/\(id)/comm")?.trimmingCharacters(in: "\n") ?? ""
            result.append((id, comm))
        }
        return result
    }

    /// Whether thread `id` still exists.
    static func threadExists(_ id: Int32) -> Bool {
        access("/proc/self/task/\(id)", F_OK) == 0
    }

    /// Nanoseconds on the clock that also counts time the machine spent asleep
    /// (`CLOCK_BOOTTIME` on Linux); compared with the monotonic clock it tells how
    /// long the machine slept.
    static func bootTimeNanoseconds() -> Int64 {
        #if os(Linux)
        var spec = timespec()
        clock_gettime(CLOCK_BOOTTIME, &spec)
        return Int64(spec.tv_sec) * 1_000_000_000 + Int64(spec.tv_nsec)
        #else
        return 0
        #endif
    }

    private static func read(_ path: String) -> String? { ProcFile.read(path) }
}

extension Substring {
    func trimmingCharacters(in set: String) -> String {
        String(drop(while: { set.contains($0) }).reversed().drop(while: { set.contains($0) }).reversed())
    }
}

extension String {
    func trimmingCharacters(in set: String) -> String {
        Substring(self).trimmingCharacters(in: set)
    }
}
