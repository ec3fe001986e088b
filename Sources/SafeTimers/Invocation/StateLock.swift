import Synchronization

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `Synchronization.Mutex`, made visible to ThreadSanitizer.
///
/// On Linux, `Mutex` locks with atomics and futex calls inside the standard
/// library, which is not built with ThreadSanitizer, so TSan sees no
/// happens-before edge between two critical sections and reports every access
/// to the protected value as a race (reproduced here with a four-thread
/// counter). `StateLock` is `Mutex` plus the two annotations TSan understands:
/// `__tsan_acquire` after locking and `__tsan_release` before unlocking, keyed by
/// the protected value's address. The functions are looked up once; outside a
/// ThreadSanitizer build they are absent and the annotations cost one
/// predictable branch.
///
/// Every SafeTimers primitive keeps its state in one of these.
package struct StateLock<Value: ~Copyable>: ~Copyable, Sendable {
    private let mutex: Mutex<Value>

    /// Creates a lock protecting `initialValue`.
    package init(_ initialValue: consuming sending Value) {
        mutex = Mutex(initialValue)
    }

    /// Runs `body` with exclusive access to the value, as `Mutex.withLock`.
    @inline(__always)
    package borrowing func withLock<Result: ~Copyable, Failure: Error>(
        _ body: (inout sending Value) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result {
        if _fastPath(!ThreadSanitizerAnnotations.mayBeActive) { return try mutex.withLock(body) }
        return try withAnnotatedLock(body)
    }

    /// ``withLock(_:)`` in a process that may run under ThreadSanitizer.
    @inline(never)
    private borrowing func withAnnotatedLock<Result: ~Copyable, Failure: Error>(
        _ body: (inout sending Value) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result {
        ThreadSanitizerAnnotations.look()
        guard let annotations = ThreadSanitizerAnnotations.functions else { return try mutex.withLock(body) }
        // The mutex's own address keys the annotations: reading it is no access
        // to the protected value, so TSan sees none before the acquire.
        let key = withUnsafePointer(to: mutex) { UnsafeMutableRawPointer(mutating: $0) }
        return try mutex.withLock { (value: inout sending Value) throws(Failure) -> sending Result in
            annotations.acquire(key)
            defer { annotations.release(key) }
            return try body(&value)
        }
    }
}

/// ThreadSanitizer's annotation functions, when the process runs with it.
enum ThreadSanitizerAnnotations {
    typealias Annotation = @convention(c) (UnsafeMutableRawPointer?) -> Void

    struct Functions: Sendable {
        let acquire: Annotation
        let release: Annotation
    }

    /// Whether this process runs under ThreadSanitizer.
    static var isActive: Bool { functions != nil }

    /// 0 until the first look, then 1 without ThreadSanitizer and 2 with it. An
    /// `Atomic` global is initialized statically, so reading it is one load;
    /// reading ``functions`` (a lazy global) calls `swift_once` every time on
    /// Linux, which was two calls per `DelayedWork` schedule and cancel.
    private static let known = Atomic<Int>(0)

    /// False once this process is known to run without ThreadSanitizer.
    @inline(__always)
    static var mayBeActive: Bool { known.load(ordering: .relaxed) != 1 }

    /// Looks once (``withLock(_:)``'s slow path).
    static func look() {
        if known.load(ordering: .relaxed) == 0 { known.store(functions == nil ? 1 : 2, ordering: .relaxed) }
    }

    static let functions: Functions? = {
        let process = UnsafeMutableRawPointer(bitPattern: 0)
        guard let acquire = dlsym(process, "__tsan_acquire"), let release = dlsym(process, "__tsan_release") else {
            return nil
        }
        return Functions(
            acquire: unsafeBitCast(acquire, to: Annotation.self), release: unsafeBitCast(release, to: Annotation.self))
    }()
}
