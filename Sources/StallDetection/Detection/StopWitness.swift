import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Measures when the whole process was continued after a stop (`SIGSTOP`, a
/// debugger's breakpoint, a cgroup freeze), so that a stop is never taken for a
/// stall, whatever the machine's load.
///
/// How: one thread per process, with every signal blocked, waits in
/// `epoll_wait` on an epoll set that never becomes ready. A stop wakes every
/// thread of the process; after the matching `SIGCONT`, Linux fails
/// `epoll_wait` with `EINTR` even without a signal handler (signal(7),
/// "Interruption of system calls and library functions by stop signals"), and
/// the witness records the monotonic time. Nothing else in the process is
/// affected: no signal handler is installed, and the calls of other threads are
/// restarted as they would be without the witness.
///
/// A stop that lands in the microseconds while the witness records the previous
/// one is missed. The witness runs only while a detector runs: the first
/// ``acquire()`` starts its thread, the last ``release()`` ends and joins it.
enum StopWitness {
    private struct State {
        var users = 0
        /// Continue times, newest last (at most 16 kept).
        var continues: [Int64] = []
        #if os(Linux)
        var thread: pthread_t?
        var wakeDescriptor: Int32 = -1
        var threadID: Int32 = 0
        /// The process whose thread `thread` is: a child made by `fork()`
        /// inherits this state, but not the thread.
        var owner: pid_t = 0
        #endif

        #if os(Linux)
        /// In a child made by `fork()`: forgets the parent's witness without
        /// touching it (a write to the inherited wake descriptor would end the
        /// parent's thread), so that the child's first detector starts its own.
        mutating func leaveParentsWitness() {
            guard thread != nil, owner != getpid() else { return }
            if wakeDescriptor >= 0 { close(wakeDescriptor) }
            thread = nil
            wakeDescriptor = -1
            threadID = 0
            users = 0
        }
        #endif
    }

    private static let state = Locked(State())

    /// Starts the witness if no detector uses it yet.
    static func acquire() {
        #if os(Linux)
        state.withLock { state in
            state.leaveParentsWitness()
            state.users += 1
            guard state.users == 1 else { return }
            let epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
            let wake = eventfd(0, Int32(EFD_CLOEXEC))
            guard epoll >= 0, wake >= 0 else {
                if epoll >= 0 { close(epoll) }
                if wake >= 0 { close(wake) }
                return
            }
            var event = epoll_event()
            event.events = EPOLLIN.rawValue
            event.data.fd = wake
            epoll_ctl(epoll, EPOLL_CTL_ADD, wake, &event)
            state.wakeDescriptor = wake
            var thread = pthread_t()
            let descriptors = UnsafeMutablePointer<Int32>.allocate(capacity: 2)
            descriptors[0] = epoll
            descriptors[1] = wake
            // Every signal blocked in the new thread, so that no signal meant for the
            // program is delivered here; the creating thread's mask is restored.
            var all = sigset_t()
            var previous = sigset_t()
            sigfillset(&all)
            pthread_sigmask(SIG_SETMASK, &all, &previous)
            let result = pthread_create(
                &thread, nil,
                { context in
                    let descriptors = context!.assumingMemoryBound(to: Int32.self)
                    StopWitness.watch(epoll: descriptors[0])
                    close(descriptors[0])
                    descriptors.deallocate()
                    return nil
                }, descriptors)
            pthread_sigmask(SIG_SETMASK, &previous, nil)
            if result == 0 {
                state.thread = thread
                state.owner = getpid()
            } else {
                descriptors.deallocate()
                close(epoll)
                close(wake)
                state.wakeDescriptor = -1
            }
        }
        #endif
    }

    /// Ends and joins the witness once no detector uses it.
    static func release() {
        #if os(Linux)
        let ending = state.withLock { state -> (pthread_t, Int32)? in
            state.leaveParentsWitness()
            guard state.users > 0 else { return nil }
            state.users -= 1
            guard state.users == 0, let thread = state.thread else { return nil }
            state.thread = nil
            state.threadID = 0
            let wake = state.wakeDescriptor
            state.wakeDescriptor = -1
            return (thread, wake)
        }
        if let (thread, wake) = ending {
            var one: UInt64 = 1
            _ = write(wake, &one, 8)
            pthread_join(thread, nil)
            close(wake)
        }
        #endif
    }

    #if os(Linux)
    private static func watch(epoll: Int32) {
        _ = pthread_setname_np(pthread_self(), "StallStopWitnes")
        let tid = stallcapture_current_tid()
        state.withLock { $0.threadID = tid }
        var event = epoll_event()
        while true {
            let result = epoll_wait(epoll, &event, 1, -1)
            if result > 0 { return }  // the wake-up descriptor: the last detector stopped
            if result < 0 && errno == EINTR {
                let now = Monotonic.now()
                state.withLock { state in
                    state.continues.append(now)
                    if state.continues.count > 16 { state.continues.removeFirst() }
                }
            }
        }
    }
    #endif

    /// The latest continue after `time`, if the process was stopped and continued
    /// since then.
    ///
    /// A continue that has happened but that the witness has not yet had the CPU to
    /// record (a loaded machine) is waited for, up to `wait`: while the witness
    /// thread is runnable rather than asleep in `epoll_wait`, a record is pending.
    /// When it is still pending after `wait` (at nice 19 beside busy processes a
    /// woken thread can wait longer than a 250 ms threshold), the process was continued
    /// and the time is not known: the answer is now, the latest the continue can
    /// have been, so that the stop is never taken for a stall.
    static func latestContinue(after time: Int64, waitingAtMost wait: Int64 = 100_000_000) -> Int64? {
        var pending = false
        #if os(Linux)
        let tid = state.withLock { $0.threadID }
        if tid != 0 {
            let deadline = Monotonic.now() + wait
            while !witnessFiles.withLock({ ThreadState.isWaitingInEpoll(thread: tid, files: $0.files(for: tid)) }) {
                if Monotonic.now() >= deadline {
                    pending = true
                    break
                }
                sched_yield()
                usleep(1_000)
            }
        }
        #endif
        let recorded = recordedContinue
        return answer(recorded: recorded, after: time, pendingAfterWait: pending, now: Monotonic.now())
    }

    /// The latest continue the witness has recorded, without waiting for one it
    /// has not (cheap: no file is read).
    static var recordedContinue: Int64? { state.withLock { $0.continues.last } }

    /// What ``latestContinue(after:waitingAtMost:)`` answers: the `recorded`
    /// continue when it is after `time`, and `now` when a continue was still
    /// unrecorded at the end of the wait.
    static func answer(recorded: Int64?, after time: Int64, pendingAfterWait: Bool, now: Int64) -> Int64? {
        if pendingAfterWait { return now }
        return recorded.flatMap { $0 > time ? $0 : nil }
    }

    /// The witness thread's `syscall` file, kept open while a stall lasts (each
    /// look during a stall reads it; opening it by path was a tenth of a stalled
    /// process' CPU), for the current witness only.
    private static let witnessFiles = Locked(WitnessFiles())

    /// Closes the witness's kept file (a stall ended).
    static func releaseFiles() {
        witnessFiles.withLock { $0 = WitnessFiles() }
    }

    struct WitnessFiles {
        private var thread: Int32 = 0
        private var kept = ProcTaskFiles()

        mutating func files(for tid: Int32) -> ProcTaskFiles {
            if tid != thread {
                kept = ProcTaskFiles()
                thread = tid
            }
            return kept
        }
    }

    /// Records a continue as if the witness had seen one (tests).
    static func recordContinueForTesting(at time: Int64) {
        state.withLock { $0.continues.append(time) }
    }
}
