#if os(Linux)
import Dispatch
import Glibc
import SafeTimers

/// The one thread of the process that calls into the toolchain's `Runtime`
/// module to name code.
///
/// `Runtime` keeps the ELF images it has read (symbol tables, debug information)
/// in a cache *per thread*. Called from whichever thread a detector looked
/// from, every call read the images again: 10 ms for one stack in
/// release, and 16 detectors naming their first stalls at once waited 100–240 ms
/// each, their looks queued behind. On this thread the images are read once
/// (``Symbolicator/warmUp()`` reads them before the first stall) and every later
/// call finds them. Calls are also serialised here: `Runtime` runs one call at a
/// time in the process, as it must (an image map taken while a call had debug
/// files mapped named nothing).
///
/// The thread starts with the first call and lives as long as the process; it
/// sleeps on a semaphore between calls (no wake-ups). A child made by `fork()`
/// (which has no copy of it) gets a thread of its own at its first call. Where
/// the system refuses a thread, calls run on the caller's thread, one at a time.
final class SymbolicationThread: Sendable {
    /// The process's symbolication thread.
    static var shared: SymbolicationThread {
        let process = getpid()
        return instance.withLock { current in
            if let current, current.process == process { return current }
            let made = SymbolicationThread(process: process)
            current = made
            return made
        }
    }

    private static let instance = Locked<SymbolicationThread?>(nil)

    /// A call waiting to run, and its result.
    ///
    /// `@unchecked Sendable` invariant: `body` and `result` are written by the
    /// symbolication thread only, between the caller's submission and its
    /// `done.signal()`; the caller reads `result` only after `done.wait()`
    /// returned, which orders the accesses.
    private final class Call<Result>: @unchecked Sendable, Runnable {
        private var body: (() -> Result)?
        var result: Result?
        /// The CPU time `body` took on the symbolication thread.
        var cpu: Int64 = 0
        let done = DispatchSemaphore(value: 0)

        init(_ body: @escaping () -> Result) {
            self.body = body
        }

        func run() {
            let before = StallProfiler.threadCPU()
            result = body?()
            body = nil
            cpu = StallProfiler.threadCPU() - before
        }

        func finish() { done.signal() }
    }

    /// The process this thread belongs to.
    private let process: pid_t
    private let calls = Locked<[any Runnable]>([])
    private let pending = DispatchSemaphore(value: 0)
    /// The kernel id of the thread, once it runs.
    private let threadID = Locked<UInt64?>(nil)
    /// No thread could be started: calls run on their callers' threads, one at
    /// a time (under this lock, which counts them).
    private let inline: Locked<Int>?

    private init(process: pid_t) {
        self.process = process
        let threadID = self.threadID
        let calls = self.calls
        let pending = self.pending
        let started = NamedThread.tryStart(name: "StallSymbols") {
            threadID.withLock { $0 = ThreadIDs.current() }
            Self.serve(calls, pending)
        }
        switch started {
        case .success(let thread):
            thread.detach()
            inline = nil
        case .failure:
            inline = Locked(0)
        }
    }

    /// Runs `body` on the symbolication thread and returns its result with the
    /// CPU time it took there; the caller waits. Called on that thread itself,
    /// runs `body` at once.
    func run<Result>(_ body: @escaping () -> Result) -> (value: Result, cpu: Int64) {
        let call = Call(body)
        if let inline {
            inline.withLock { calls in
                calls &+= 1
                call.run()
            }
        } else if threadID.withLock({ $0 }) == ThreadIDs.current() {
            call.run()
        } else {
            calls.withLock { $0.append(call) }
            pending.signal()
            call.done.wait()
        }
        // Set before `done` was signalled (see `Call`).
        return (call.result!, call.cpu)
    }

    private static func serve(_ calls: Locked<[any Runnable]>, _ pending: DispatchSemaphore) {
        while true {
            pending.wait()
            guard let call = calls.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) else { continue }
            call.run()
            call.finish()
        }
    }
}

/// A call the symbolication thread runs, whatever its result type.
private protocol Runnable: AnyObject, Sendable {
    func run()
    func finish()
}
#endif
