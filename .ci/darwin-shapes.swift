// Darwin's shapes of the C declarations whose Swift spelling differs from glibc's,
// for `.ci/platform-check.py`: compiled here as a module named `Darwin` that
// re-exports `Glibc`, so that a file's Darwin branches type-check on Linux. Each
// declaration below shadows glibc's of the same name; what is not declared here
// is glibc's, so this catches the differences listed, not every one: integer
// typedefs (`mode_t`, `clockid_t`, `pthread_key_t`) keep glibc's types, and, as a
// Swift module cannot declare a type and a function of one name, the functions
// `stat` and `sigaction` keep glibc's shapes. Functions are `@discardableResult`,
// as Swift imports C functions. Written from the macOS SDK's headers
// (<sys/stat.h>, <sys/signal.h>, <sys/_types/_sigaltstack.h>, <sys/resource.h>,
// <time.h>, <pthread.h>, <pthread/qos.h>), not generated from them.

@_exported import Glibc

// MARK: struct stat: the times are `st_atimespec`, `st_mtimespec`, `st_ctimespec`.

public struct stat {
    public var st_dev: Int32 = 0
    public var st_mode: mode_t = 0
    public var st_nlink: UInt16 = 0
    public var st_ino: UInt64 = 0
    public var st_uid: uid_t = 0
    public var st_gid: gid_t = 0
    public var st_rdev: Int32 = 0
    public var st_atimespec = timespec()
    public var st_mtimespec = timespec()
    public var st_ctimespec = timespec()
    public var st_birthtimespec = timespec()
    public var st_size: off_t = 0
    public var st_blocks: Int64 = 0
    public var st_blksize: Int32 = 0
    public var st_flags: UInt32 = 0
    public init() {}
}

@discardableResult public func fstatat(
    _ descriptor: Int32, _ path: UnsafePointer<CChar>!, _ status: UnsafeMutablePointer<stat>!, _ flags: Int32
) -> Int32 { 0 }
@discardableResult public func fstat(_ descriptor: Int32, _ status: UnsafeMutablePointer<stat>!) -> Int32 { 0 }
@discardableResult public func lstat(_ path: UnsafePointer<CChar>!, _ status: UnsafeMutablePointer<stat>!) -> Int32 { 0 }

// MARK: struct sigaction: the handler is in the union `__sigaction_u`.

public struct __sigaction_u {
    public var __sa_handler: (@convention(c) (Int32) -> Void)?
    public var __sa_sigaction: (@convention(c) (Int32, UnsafeMutablePointer<siginfo_t>?, UnsafeMutableRawPointer?) -> Void)?
    public init() {}
}

public struct sigaction {
    public var __sigaction_u = Darwin.__sigaction_u()
    public var sa_mask: sigset_t = sigset_t()
    public var sa_flags: Int32 = 0
    public init() {}
}

// MARK: stack_t: the members are `ss_sp, ss_size, ss_flags`, in that order.

public struct stack_t {
    public var ss_sp: UnsafeMutableRawPointer?
    public var ss_size: Int
    public var ss_flags: Int32
    public init() {
        (ss_sp, ss_size, ss_flags) = (nil, 0, 0)
    }
    public init(ss_sp: UnsafeMutableRawPointer?, ss_size: Int, ss_flags: Int32) {
        (self.ss_sp, self.ss_size, self.ss_flags) = (ss_sp, ss_size, ss_flags)
    }
}

@discardableResult public func sigaltstack(_ stack: UnsafePointer<stack_t>!, _ old: UnsafeMutablePointer<stack_t>!) -> Int32 { 0 }

// MARK: Resource limits, usage and interval timers: plain `Int32` constants, not enums.

public var RLIMIT_NOFILE: Int32 { 8 }
public var RLIMIT_STACK: Int32 { 3 }
public var RLIMIT_CORE: Int32 { 4 }
public var RUSAGE_SELF: Int32 { 0 }
public var RUSAGE_CHILDREN: Int32 { -1 }
public var SOCK_STREAM: Int32 { 1 }
public var SOCK_DGRAM: Int32 { 2 }
@discardableResult public func getrlimit(_ resource: Int32, _ limit: UnsafeMutablePointer<rlimit>!) -> Int32 { 0 }
@discardableResult public func setrlimit(_ resource: Int32, _ limit: UnsafePointer<rlimit>!) -> Int32 { 0 }
@discardableResult public func getrusage(_ who: Int32, _ usage: UnsafeMutablePointer<rusage>!) -> Int32 { 0 }
public var ITIMER_PROF: Int32 { 2 }
@discardableResult public func setitimer(
    _ which: Int32, _ value: UnsafePointer<itimerval>!, _ old: UnsafeMutablePointer<itimerval>!
) -> Int32 { 0 }

// MARK: Not on Darwin at all.

@available(*, unavailable, message: "Darwin has no clock_nanosleep")
@discardableResult public func clock_nanosleep(
    _ clock: clockid_t, _ flags: Int32, _ request: UnsafePointer<timespec>!, _ remaining: UnsafeMutablePointer<timespec>!
) -> Int32 { 0 }
@available(*, unavailable, message: "Darwin has no TIMER_ABSTIME")
public var TIMER_ABSTIME: Int32 { 1 }
@available(*, unavailable, message: "Darwin has no CLOCK_BOOTTIME")
public var CLOCK_BOOTTIME: Int32 { 7 }

// MARK: Darwin only.

public var CLOCK_UPTIME_RAW: clockid_t { clockid_t(8) }
@discardableResult public func clock_gettime_nsec_np(_ clock: clockid_t) -> UInt64 { 0 }
@discardableResult public func pthread_main_np() -> Int32 { 0 }
@discardableResult public func pthread_setname_np(_ name: UnsafePointer<CChar>) -> Int32 { 0 }
@available(*, unavailable, message: "Darwin's pthread_setname_np names the calling thread only")
@discardableResult public func pthread_setname_np(_ thread: Glibc.pthread_t, _ name: UnsafePointer<CChar>) -> Int32 { 0 }

// MARK: Threads: `pthread_t` is a pointer (so `pthread_create` fills a `pthread_t?`), the
// thread routine and a key's destructor take a non-optional pointer, a thread names only
// itself.

public struct _opaque_pthread_t {}
public typealias pthread_t = UnsafeMutablePointer<_opaque_pthread_t>
@discardableResult public func pthread_self() -> pthread_t { pthread_t(bitPattern: 1)! }
@discardableResult public func pthread_create(
    _ thread: UnsafeMutablePointer<pthread_t?>!, _ attributes: UnsafePointer<pthread_attr_t>?,
    _ routine: @convention(c) (UnsafeMutableRawPointer) -> UnsafeMutableRawPointer?,
    _ argument: UnsafeMutableRawPointer?
) -> Int32 { 0 }
@discardableResult public func pthread_join(_ thread: pthread_t, _ result: UnsafeMutablePointer<UnsafeMutableRawPointer?>?) -> Int32 {
    0
}
@discardableResult public func pthread_detach(_ thread: pthread_t) -> Int32 { 0 }
@discardableResult public func pthread_kill(_ thread: pthread_t, _ signal: Int32) -> Int32 { 0 }
@discardableResult public func pthread_key_create(
    _ key: UnsafeMutablePointer<pthread_key_t>!, _ destructor: (@convention(c) (UnsafeMutableRawPointer) -> Void)?
) -> Int32 { 0 }
@discardableResult public func pthread_cond_timedwait_relative_np(
    _ condition: UnsafeMutablePointer<pthread_cond_t>!, _ mutex: UnsafeMutablePointer<pthread_mutex_t>!,
    _ relative: UnsafePointer<timespec>!
) -> Int32 { 0 }
public struct qos_class_t: Equatable {
    public var rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
}
public var QOS_CLASS_USER_INTERACTIVE: qos_class_t { qos_class_t(rawValue: 0x21) }
@discardableResult public func pthread_set_qos_class_self_np(_ qos: qos_class_t, _ priority: Int32) -> Int32 { 0 }
