#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// The system calls whose Swift spelling differs between glibc and Darwin, one
// function each, so that the scenarios read the same on both.

/// Sleeps until `deadline` on `CLOCK_MONOTONIC`. Darwin has no
/// `clock_nanosleep`: there the time left is slept.
func sleepUntilMonotonic(_ deadline: timespec) {
    #if canImport(Darwin)
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let left =
        (Int64(deadline.tv_sec) - Int64(now.tv_sec)) * 1_000_000_000 + Int64(deadline.tv_nsec) - Int64(now.tv_nsec)
    guard left > 0 else { return }
    var request = timespec(tv_sec: Int(left / 1_000_000_000), tv_nsec: Int(left % 1_000_000_000))
    nanosleep(&request, nil)
    #else
    var deadline = deadline
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, nil)
    #endif
}

/// This process's limit of open descriptors (`RLIMIT_NOFILE`).
func openFilesLimit() -> rlimit {
    var limit = rlimit()
    #if canImport(Darwin)
    getrlimit(RLIMIT_NOFILE, &limit)
    #else
    getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    #endif
    return limit
}

/// Sets this process's limit of open descriptors (`RLIMIT_NOFILE`).
func setOpenFilesLimit(_ limit: rlimit) {
    var limit = limit
    #if canImport(Darwin)
    setrlimit(RLIMIT_NOFILE, &limit)
    #else
    setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    #endif
}

/// Arms this process's `ITIMER_PROF` (SIGPROF every `microseconds` of the
/// process's CPU time); glibc spells the timer's kind as an enum.
func setProfilingTimer(microseconds: Int) {
    let interval = timeval(tv_sec: microseconds / 1_000_000, tv_usec: .init(microseconds % 1_000_000))
    var timer = itimerval(it_interval: interval, it_value: interval)
    #if canImport(Darwin)
    setitimer(ITIMER_PROF, &timer, nil)
    #else
    setitimer(__itimer_which_t(ITIMER_PROF.rawValue), &timer, nil)
    #endif
}

/// Opens `path` for reading (the C library's `open`, not Foundation's).
func openReadOnly(_ path: String) -> Int32 {
    #if canImport(Darwin)
    return Darwin.open(path, O_RDONLY)
    #else
    return Glibc.open(path, O_RDONLY)
    #endif
}

/// Sets the plain handler (`sa_handler`) of a `sigaction`: glibc keeps it in
/// the union `__sigaction_handler`, Darwin in `__sigaction_u`.
func setPlainHandler(_ action: inout sigaction, _ handler: @escaping @convention(c) (Int32) -> Void) {
    #if canImport(Darwin)
    action.__sigaction_u.__sa_handler = handler
    #else
    action.__sigaction_handler.sa_handler = handler
    #endif
}

/// Sets `action`'s three-argument handler (`SA_SIGINFO`).
func setInfoHandler(
    _ action: inout sigaction,
    _ handler: @escaping @convention(c) (Int32, UnsafeMutablePointer<siginfo_t>?, UnsafeMutableRawPointer?) -> Void
) {
    #if canImport(Darwin)
    action.__sigaction_u.__sa_sigaction = handler
    #else
    action.__sigaction_handler.sa_sigaction = handler
    #endif
}

/// An alternate signal stack description (the members' order differs: glibc's
/// `ss_sp, ss_flags, ss_size`, Darwin's `ss_sp, ss_size, ss_flags`).
func signalStack(_ memory: UnsafeMutableRawPointer?, size: Int, flags: Int32) -> stack_t {
    var stack = stack_t()
    stack.ss_sp = memory
    stack.ss_size = size
    stack.ss_flags = flags
    return stack
}
