import Dispatch
import SafeTimers

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A serial worker with a thread of its own: where a detector looks, samples
/// and calls its `onEvent` handler.
///
/// Not a dispatch queue: libdispatch on Linux starts at most 255 threads for the
/// serial queues of one quality of service, and a program whose queues hold
/// them all, blocked, is a program whose stalls must be reported. A worker's
/// thread is started by the worker (`pthread_create`, which that limit does not
/// reach), with the first job after an idle while, and ends after
/// ``idleLifetime`` without jobs: an idle detector holds no thread. Where the
/// system refuses a thread, the worker runs its jobs on a dispatch queue from
/// then on, in the same order.
///
/// A `TaskExecutor` too: a `DelayedWork` scheduled with `executor:` this worker
/// (a look, a sample) runs its closure here, in a task whose one job is
/// enqueued here directly.
///
/// `@unchecked Sendable` invariant: every stored `var` is read and written only
/// with `lock` held.
final class DetectorWorker: TaskExecutor, @unchecked Sendable {
    /// A job: a closure, or a task's job (``enqueue(_:)-(ExecutorJob)``).
    private enum Job {
        case closure(@Sendable () -> Void)
        case task(UnownedJob)
    }

    /// How long the thread waits for a job before it ends.
    let idleLifetime: Int64
    private let name: String
    private let lock = ConditionLock()
    /// Jobs not begun yet, from `head` on.
    private var jobs: [Job?] = []
    private var head = 0
    /// Whether a thread serves the jobs now (it may be waiting for one).
    private var threadRunning = false
    /// The thread running a job now, for ``sync(_:)`` called from a job.
    private var runningOn: pthread_t?
    /// Where jobs go once the system refused a thread.
    private var fallback: DispatchQueue?
    /// Set by ``finish()``: the thread ends as soon as it has no job.
    private var finishing = false
    /// Threads started so far.
    private var started = 0

    /// A worker whose thread is named `name` (up to 15 characters show on
    /// Linux).
    init(name: String, idleLifetime: Duration = .seconds(2)) {
        self.name = name
        self.idleLifetime = max(1, Monotonic.nanoseconds(idleLifetime))
    }

    /// Runs `body` on the worker after the jobs before it.
    func async(_ body: @escaping @Sendable () -> Void) {
        submit(.closure(body))
    }

    /// Runs `body` on the worker after the jobs before it and waits for it;
    /// called from one of the worker's jobs, runs `body` at once.
    func sync<Result>(_ body: @escaping () -> Result) -> Result {
        if isCurrent { return body() }
        let call = SyncCall(body)
        submit(.closure { call.run() })
        call.done.wait()
        // Set before `done` was signalled (see `SyncCall`).
        return call.result!
    }

    /// Whether the calling thread runs one of this worker's jobs now.
    var isCurrent: Bool {
        let current = pthread_self()
        return lock.withLock { runningOn.map { pthread_equal($0, current) != 0 } ?? false }
    }

    /// Whether a thread of the worker's own serves it now (tests read it).
    var hasThread: Bool { lock.withLock { threadRunning } }

    /// Threads the worker started so far (tests read it).
    var threadsStarted: Int { lock.withLock { started } }

    /// The worker's owner stopped: its thread ends once the jobs given so far
    /// have run, without an idle while (a job given later starts a thread that
    /// ends the same way).
    func finish() {
        lock.withLock {
            finishing = true
            lock.signal()
        }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        submit(.task(UnownedJob(job)))
    }

    private func submit(_ job: Job) {
        lock.lock()
        if let fallback {
            lock.unlock()
            fallback.async { self.run(job) }
            return
        }
        jobs.append(job)
        if threadRunning {
            lock.signal()
            lock.unlock()
            return
        }
        threadRunning = true
        lock.unlock()
        startThread()
    }

    /// Starts the thread, or moves every job to a dispatch queue when the
    /// system refuses one.
    private func startThread() {
        switch NamedThread.tryStart(name: name, { [self] in serve() }) {
        case .success(let thread):
            thread.detach()
            lock.withLock { started += 1 }
        case .failure:
            let queue = DispatchQueue(label: name, qos: .userInteractive)
            let waiting = lock.withLock {
                threadRunning = false
                fallback = queue
                defer { (jobs, head) = ([], 0) }
                return jobs[head...].compactMap { $0 }
            }
            for job in waiting { queue.async { self.run(job) } }
        }
    }

    /// The thread's loop: jobs in order, then a wait of ``idleLifetime`` at most.
    private func serve() {
        lock.lock()
        while true {
            if head < jobs.count {
                let job = jobs[head].take()!
                head += 1
                if head == jobs.count {
                    jobs.removeAll(keepingCapacity: true)
                    head = 0
                }
                lock.unlock()
                run(job)
                lock.lock()
                continue
            }
            let deadline = Monotonic.now() + idleLifetime
            if !finishing { lock.wait(untilMonotonic: deadline) }
            if head == jobs.count, finishing || Monotonic.now() >= deadline {
                threadRunning = false
                lock.unlock()
                return
            }
        }
    }

    private func run(_ job: Job) {
        let current = pthread_self()
        lock.withLock { runningOn = current }
        switch job {
        case .closure(let body): body()
        case .task(let task): task.runSynchronously(on: asUnownedTaskExecutor())
        }
        lock.withLock { runningOn = nil }
    }
}

/// A ``DetectorWorker/sync(_:)`` call and its result.
///
/// `@unchecked Sendable` invariant: `body` and `result` are used by the worker
/// only, between the submission and `done.signal()`; the caller reads `result`
/// only after `done.wait()` returned, which orders the accesses.
private final class SyncCall<Result>: @unchecked Sendable {
    private let body: () -> Result
    var result: Result?
    let done = DispatchSemaphore(value: 0)

    init(_ body: @escaping () -> Result) {
        self.body = body
    }

    func run() {
        result = body()
        done.signal()
    }
}
