import Synchronization

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Small facts about the current thread, without a C shim.
///
/// glibc declares `gettid` and `pthread_setname_np` only under `_GNU_SOURCE`,
/// which Swift's `Glibc` module does not define, so on Linux they are looked up
/// once with `dlsym`; where the lookup fails the functions quietly do nothing.
package enum ThreadIdentity {
    #if os(Linux)
    private typealias GetTID = @convention(c) () -> Int32
    private typealias SetName = @convention(c) (pthread_t, UnsafePointer<CChar>) -> Int32

    private static let getTID: GetTID? = symbol("gettid")
    private static let setName: SetName? = symbol("pthread_setname_np")

    private static func symbol<F>(_ name: String) -> F? {
        guard let address = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) else { return nil }
        return unsafeBitCast(address, to: F.self)
    }
    #endif

    /// The kernel's id of the current thread (Linux), or 0 where there is none.
    package static func currentKernelThreadID() -> Int32 {
        #if os(Linux)
        return getTID?() ?? 0
        #else
        return 0
        #endif
    }

    /// An id of the current thread, comparable with `==` among live threads:
    /// a number given to each thread at its first call, counting from 1, below
    /// 2^32 (so that a primitive keeps the thread running its handler in four
    /// bytes). Numbers are never reused while fewer than 2^32 threads have asked
    /// for one; `pthread_self()` values are reused as soon as a thread ends.
    @inline(__always)
    package static func current() -> UInt {
        let number = UInt(bitPattern: pthread_getspecific(numberKey.key))
        return _fastPath(number != 0) ? number : assignNumber()
    }

    /// The calling thread's shard number (see `TimerEngine`'s shards): given at
    /// a thread's first arming, in the order threads first arm, so that threads
    /// that arm spread over the shards evenly. (Deriving it from ``current()``,
    /// which GCD workers and every canceller ask for too, put two arming threads
    /// in one shard about a time in four.)
    @inline(__always)
    static func shard() -> Int {
        let shardPlusOne = Int(bitPattern: pthread_getspecific(shardKey.key))
        return _fastPath(shardPlusOne != 0) ? shardPlusOne &- 1 : assignShard()
    }

    /// The last shard number given out.
    private static let lastShard = Atomic<Int>(-1)
    private static let shardKey = LazyThreadKey()

    private static func assignShard() -> Int {
        let shard = lastShard.wrappingAdd(1, ordering: .relaxed).newValue & 0xFFFF
        pthread_setspecific(shardKey.key, UnsafeRawPointer(bitPattern: shard &+ 1))
        return shard
    }

    /// The last number given out.
    private static let lastNumber = Atomic<UInt32>(0)

    private static let numberKey = LazyThreadKey()

    private static func assignNumber() -> UInt {
        var number = lastNumber.wrappingAdd(1, ordering: .relaxed).newValue
        if number == 0 { number = lastNumber.wrappingAdd(1, ordering: .relaxed).newValue }
        pthread_setspecific(numberKey.key, UnsafeRawPointer(bitPattern: UInt(number)))
        return UInt(number)
    }

    /// Whether the current thread is the process's main thread.
    package static var isMainThread: Bool {
        #if canImport(Darwin)
        return pthread_main_np() != 0
        #elseif os(Linux)
        return currentKernelThreadID() == getpid()
        #else
        return false
        #endif
    }

    /// Names the current thread (shown by debuggers, `top -H` and crash reports).
    package static func nameCurrentThread(_ name: String) {
        #if canImport(Darwin)
        pthread_setname_np(name)
        #elseif os(Linux)
        _ = setName?(pthread_self(), name)
        #endif
    }

    /// On Apple platforms, moves the calling thread to the user-interactive QoS
    /// class: Darwin coalesces the timers of lower classes (a background thread's
    /// timed wait may end late by design), which would make the scheduler fire
    /// late and a stall detector miss or misjudge stalls. The scheduler's and the
    /// detectors' threads sleep almost always, so the class costs nothing.
    /// No effect elsewhere (Linux has no timer coalescing by class; its timer
    /// slack is set by ``minimizeTimerSlack()``).
    static func raiseToUserInteractive() {
        #if canImport(Darwin)
        _ = pthread_set_qos_class_self_np(QOS_CLASS_USER_INTERACTIVE, 0)
        #endif
    }

    /// Asks Linux to end the calling thread's timed waits on time.
    ///
    /// By default the kernel may let a timed wait of an ordinary thread end up to
    /// 50 µs late ("timer slack"), to batch wake-ups. For the scheduler thread that
    /// is pure lateness, so it sets its slack to 1 ns (`PR_SET_TIMERSLACK`); the
    /// leeway of each timer is where SafeTimers trades precision for fewer
    /// wake-ups instead. `prctl` is variadic, which Swift cannot call, so it is
    /// looked up and called with its five integer arguments, the way the x86-64 and
    /// AArch64 Linux calling conventions pass them either way. No effect elsewhere.
    static func minimizeTimerSlack() {
        #if os(Linux)
        typealias Prctl = @convention(c) (Int32, UInt, UInt, UInt, UInt) -> Int32
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "prctl") else { return }
        let prctl = unsafeBitCast(symbol, to: Prctl.self)
        let setTimerSlack: Int32 = 29  // PR_SET_TIMERSLACK
        _ = prctl(setTimerSlack, 1, 0, 0, 0)
        #endif
    }
}

/// A `pthread_key_t` made at its first use, with an optional destructor.
///
/// The key + 1 sits in an `Atomic` (0 until it is made): an `Atomic` global is
/// initialized statically, so reading it is one load, where a lazy `static let`
/// calls `swift_once` at every read on Linux.
struct LazyThreadKey: ~Copyable, Sendable {
    #if canImport(Darwin)
    typealias Destructor = @convention(c) (UnsafeMutableRawPointer) -> Void
    #else
    typealias Destructor = @convention(c) (UnsafeMutableRawPointer?) -> Void
    #endif

    private let keyPlusOne = Atomic<Int>(0)
    /// Called by the system with a thread's non-nil value when the thread ends.
    private let destructor: Destructor?

    init(destructor: Destructor? = nil) {
        self.destructor = destructor
    }

    @inline(__always)
    var key: pthread_key_t {
        let stored = keyPlusOne.load(ordering: .acquiring)
        return _fastPath(stored != 0) ? pthread_key_t(truncatingIfNeeded: stored &- 1) : make()
    }

    /// Makes the key; when two threads race, the first stored key is kept and the
    /// other deleted.
    private func make() -> pthread_key_t {
        var key = pthread_key_t()
        let result = pthread_key_create(&key, destructor)
        precondition(result == 0, "pthread_key_create failed: \(result)")
        let (exchanged, original) = keyPlusOne.compareExchange(
            expected: 0, desired: Int(key) &+ 1, ordering: .acquiringAndReleasing)
        if exchanged { return key }
        pthread_key_delete(key)
        return pthread_key_t(truncatingIfNeeded: original &- 1)
    }
}
