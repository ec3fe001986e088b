import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Reads a thread's scheduler state from `/proc/self/task/TID/stat`.
enum ThreadState {
    /// The state letter (R running, S sleeping, D uninterruptible, T stopped, …), or
    /// nil when the thread is gone.
    static func letter(thread: Int32) -> Character? {
        ProcTaskFiles().stateLetter(thread: thread)
    }

    /// Whether the thread sleeps in the kernel (S or D).
    static func isAsleep(thread: Int32) -> Bool {
        isAsleep(letter(thread: thread))
    }

    /// Whether a state letter is asleep in the kernel (S or D); a gone thread
    /// (nil) counts as asleep.
    static func isAsleep(_ letter: Character?) -> Bool {
        guard let letter else { return true }
        return letter == "S" || letter == "D"
    }

    /// Whether the thread sleeps in `epoll_wait` (an event loop parked), by the
    /// system call number in `/proc/self/task/TID/syscall`; false when unknown
    /// (and on other platforms).
    static func isInEventWait(thread: Int32, files: ProcTaskFiles = ProcTaskFiles()) -> Bool {
        syscallNumber(thread: thread, files: files).flatMap(isEpollWait) ?? false
    }

    /// Whether the thread sleeps in `epoll_wait` (not, say, on a lock): the system
    /// call number in `/proc/self/task/TID/syscall`. Where the number is unknown,
    /// whether it sleeps at all.
    static func isWaitingInEpoll(thread: Int32, files: ProcTaskFiles) -> Bool {
        guard let line = files.read(.syscall, thread: thread) else { return true }
        guard let epoll = syscallNumber(in: line).flatMap(isEpollWait) else {
            return isAsleep(files.stateLetter(thread: thread))
        }
        return epoll
    }

    private static func syscallNumber(thread: Int32, files: ProcTaskFiles) -> Int? {
        files.read(.syscall, thread: thread).flatMap(syscallNumber(in:))
    }

    /// The system call number a `syscall` line starts with (nil for "running").
    private static func syscallNumber(in line: String) -> Int? {
        line.split(separator: " ").first.flatMap { Int($0) }
    }

    /// Whether system call `number` waits in epoll (`epoll_wait`, `epoll_pwait`,
    /// `epoll_pwait2`); nil where the numbers are not known.
    private static func isEpollWait(_ number: Int) -> Bool? {
        #if os(Linux) && arch(x86_64)
        return number == 232 || number == 281 || number == 441
        #elseif os(Linux) && arch(arm64)
        return number == 22 || number == 441
        #else
        return nil
        #endif
    }
}
