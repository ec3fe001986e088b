@_spi(SafeTimersInternal) import SafeTimers

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A joinable handle to a started ``DetectorThread``.
///
/// `@unchecked Sendable` invariant: the wrapped `pthread_t` is joined exactly once,
/// by ``join()``, which ``DetectorCore/stop()`` calls at most once (its mailbox
/// hands the handle out once).
struct DetectorThreadHandle: @unchecked Sendable {
    #if canImport(Darwin)
    fileprivate let thread: pthread_t?
    #else
    fileprivate let thread: pthread_t
    #endif

    /// Waits until the thread has exited.
    func join() {
        #if canImport(Darwin)
        if let thread { pthread_join(thread, nil) }
        #else
        pthread_join(thread, nil)
        #endif
    }
}

/// A plain pthread named "StallDetector" running one closure. The detector must
/// not depend on the Dispatch thread pool it watches: when that pool is exhausted
/// or blocked, a detector built on it would be blocked too.
struct DetectorThread {
    private let body: @Sendable () -> Void

    init(_ body: @escaping @Sendable () -> Void) {
        self.body = body
    }

    func start() -> DetectorThreadHandle {
        final class Box: Sendable {
            let body: @Sendable () -> Void
            init(_ body: @escaping @Sendable () -> Void) { self.body = body }
        }
        let context = Unmanaged.passRetained(Box(body)).toOpaque()
        #if canImport(Darwin)
        var thread: pthread_t? = nil
        #else
        var thread = pthread_t()
        #endif
        let result = pthread_create(
            &thread, nil,
            { context in
                #if canImport(Darwin)
                let box = Unmanaged<Box>.fromOpaque(context).takeRetainedValue()
                #else
                let box = Unmanaged<Box>.fromOpaque(context!).takeRetainedValue()
                #endif
                ThreadIdentity.nameCurrentThread("StallDetector")
                box.body()
                return nil
            }, context)
        precondition(result == 0, "StallDetector could not start its thread: pthread_create returned \(result)")
        return DetectorThreadHandle(thread: thread)
    }
}
