#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A plain named pthread running one closure: the scheduler's thread and each stall
/// detector's. Neither may depend on the Dispatch thread pool: the scheduler feeds
/// it, and a detector watches it.
///
/// `@unchecked Sendable` invariant: the wrapped `pthread_t` is only passed to
/// `pthread_join` or `pthread_detach`, once, by whoever started the thread.
package struct NamedThread: @unchecked Sendable {
    #if canImport(Darwin)
    private let thread: pthread_t?
    #else
    private let thread: pthread_t
    #endif

    /// Starts a thread named `name` (up to 15 characters show on Linux) running
    /// `body`; traps, naming the error, when the system refuses a thread.
    package static func start(name: String, _ body: @escaping @Sendable () -> Void) -> NamedThread {
        switch tryStart(name: name, body) {
        case .success(let thread): return thread
        case .failure(let error):
            preconditionFailure("SafeTimers could not start thread '\(name)': pthread_create returned \(error.code)")
        }
    }

    /// `pthread_create`'s error number.
    package struct StartError: Error {
        package let code: Int32
    }

    /// Starts a thread named `name` running `body`, or says why the system
    /// refused one (`EAGAIN`: a thread limit reached).
    package static func tryStart(
        name: String, _ body: @escaping @Sendable () -> Void
    ) -> Result<NamedThread, StartError> {
        final class Start: Sendable {
            let name: String
            let body: @Sendable () -> Void
            init(name: String, body: @escaping @Sendable () -> Void) {
                self.name = name
                self.body = body
            }
        }
        let context = Unmanaged.passRetained(Start(name: name, body: body)).toOpaque()
        #if canImport(Darwin)
        var thread: pthread_t? = nil
        #else
        var thread = pthread_t()
        #endif
        let result = pthread_create(
            &thread, nil,
            { context in
                #if canImport(Darwin)
                let start = Unmanaged<Start>.fromOpaque(context).takeRetainedValue()
                #else
                let start = Unmanaged<Start>.fromOpaque(context!).takeRetainedValue()
                #endif
                ThreadIdentity.nameCurrentThread(start.name)
                ThreadIdentity.raiseToUserInteractive()
                start.body()
                return nil
            }, context)
        guard result == 0 else {
            // The thread never ran: its context is still retained.
            Unmanaged<AnyObject>.fromOpaque(context).release()
            return .failure(StartError(code: result))
        }
        return .success(NamedThread(thread: thread))
    }

    /// Waits until the thread has exited.
    package func join() {
        #if canImport(Darwin)
        if let thread { pthread_join(thread, nil) }
        #else
        pthread_join(thread, nil)
        #endif
    }

    /// Lets the thread's resources go when it exits, without anyone joining it.
    package func detach() {
        #if canImport(Darwin)
        if let thread { pthread_detach(thread) }
        #else
        pthread_detach(thread)
        #endif
    }
}
