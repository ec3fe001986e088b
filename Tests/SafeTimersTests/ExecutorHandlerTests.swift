import Dispatch
import Foundation
import SafeTimersTesting
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// A `SerialExecutor` that runs jobs on a serial dispatch queue of its own, the
/// way a SwiftNIO event loop runs them on its thread: it can tell whether code
/// runs on it, and counts the jobs it was given.
final class QueueSerialExecutor: SerialExecutor {
    let queue: DispatchQueue
    private let key = DispatchSpecificKey<Bool>()
    let jobs = Counter()

    init(label: String = "test.serial-executor") {
        queue = DispatchQueue(label: label)
        queue.setSpecific(key: key, value: true)
    }

    var isCurrent: Bool { DispatchQueue.getSpecific(key: key) ?? false }

    func enqueue(_ job: consuming ExecutorJob) {
        jobs.increment()
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}

/// A `TaskExecutor` over a concurrent dispatch queue of its own.
final class QueueTaskExecutor: TaskExecutor {
    let queue: DispatchQueue
    private let key = DispatchSpecificKey<Bool>()

    init() {
        queue = DispatchQueue(label: "test.task-executor", attributes: .concurrent)
        queue.setSpecific(key: key, value: true)
    }

    var isCurrent: Bool { DispatchQueue.getSpecific(key: key) ?? false }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}

/// Handlers on Swift executors (`executor:`): every primitive that takes
/// `queue:` can run its handler on a `SerialExecutor` (an event loop's) or a
/// `TaskExecutor` instead, directly, in deadline order, with the same promises.
@Suite("Handlers on Swift executors")
struct ExecutorHandlerTests {
    @Test("DelayedWork runs on the serial executor, as one job of it")
    func delayedWorkOnSerialExecutor() {
        let executor = QueueSerialExecutor()
        let onExecutor = Counter()
        let runs = Counter()
        _ = DelayedWork.schedule(after: .milliseconds(1), executor: executor) {
            if executor.isCurrent { onExecutor.increment() }
            runs.increment()
        }
        waitUntil { runs.count == 1 }
        #expect(runs.count == 1)
        #expect(onExecutor.count == 1)
        #expect(executor.jobs.count == 1)
    }

    @Test("handlers due together for one serial executor run in scheduling order, one job per 16")
    func deadlineOrderOnSerialExecutor() {
        let scheduler = SystemTimerScheduler()
        let executor = QueueSerialExecutor()
        let order = StateLock<[Int]>([])
        let count = 64
        let deadline = scheduler.clock.now.advanced(by: .milliseconds(100))
        let works = (0..<count).map { index in
            DelayedWork.schedule(at: deadline, executor: executor, scheduler: scheduler) {
                order.withLock { $0.append(index) }
            }
        }
        waitUntil { order.withLock { $0.count } == count }
        #expect(order.withLock { $0 } == Array(0..<count))
        #expect(executor.jobs.count == count / DeliveryBatch.handlersPerHop)
        withExtendedLifetime(works) {}
    }

    @Test("a repeating timer on a TaskExecutor ticks there, and cancel() is still a barrier")
    func repeatingTimerOnTaskExecutor() {
        let executor = QueueTaskExecutor()
        let ticks = Counter()
        let elsewhere = Counter()
        let timer = RepeatingTimer(interval: .milliseconds(2), repetitions: 5, executor: executor) {
            if !executor.isCurrent { elsewhere.increment() }
            ticks.increment()
        }
        timer.start()
        waitUntil { timer.state == .finished }
        #expect(ticks.count == 5)
        #expect(elsewhere.count == 0)

        let running = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let inHandler = Counter()
        let blocking = RepeatingTimer(interval: .milliseconds(1), executor: executor) {
            inHandler.increment()
            running.signal()
            release.wait()
            inHandler.increment()
        }
        blocking.start()
        running.wait()
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(20)) { release.signal() }
        blocking.cancel()
        #expect(inHandler.count == 2)
    }

    @Test("watchdog, debouncer, throttler and withWatchdog deliver on the executor")
    func everyPrimitive() async {
        let executor = QueueSerialExecutor()
        let hits = StateLock<[String: Bool]>([:])
        @Sendable func note(_ name: String) -> @Sendable () -> Void {
            { hits.withLock { $0[name] = executor.isCurrent } }
        }
        let dog = Watchdog(timeout: .milliseconds(1), executor: executor, onTimeout: note("watchdog"))
        let debouncer = Debouncer(delay: .milliseconds(1), executor: executor)
        debouncer.call(note("debouncer"))
        let throttler = Throttler(interval: .milliseconds(1), executor: executor)
        throttler.call(note("throttler"))
        withWatchdog(timeout: .milliseconds(1), executor: executor, onTimeout: note("withWatchdog")) {
            waitUntil { hits.withLock { $0["withWatchdog"] != nil } }
        }
        await withWatchdog(timeout: .milliseconds(1), executor: executor, onTimeout: note("async withWatchdog")) {
            _ = await eventually { hits.withLock { $0["async withWatchdog"] != nil } }
        }
        let owner = Tracked()
        let owned = RepeatingTimer(interval: .milliseconds(1), owner: owner, repetitions: 1, executor: executor) { _ in
            note("owned timer")()
        }
        owned.start()
        waitUntil { hits.withLock { $0.count } == 6 }
        #expect(
            hits.withLock { $0 } == [
                "watchdog": true, "debouncer": true, "throttler": true, "withWatchdog": true,
                "async withWatchdog": true, "owned timer": true,
            ])
        withExtendedLifetime((dog, debouncer, throttler, owner)) {}
    }

    @Test("under a ManualTimerScheduler the handler runs inside advance, on the advancing thread")
    func manualScheduler() {
        let manual = ManualTimerScheduler()
        let executor = QueueSerialExecutor()
        let runs = Counter()
        let onExecutor = Counter()
        _ = DelayedWork.schedule(after: .seconds(1), executor: executor, scheduler: manual) {
            if executor.isCurrent { onExecutor.increment() }
            runs.increment()
        }
        manual.advance(by: .seconds(1))
        #expect(runs.count == 1)
        #expect(onExecutor.count == 0)
        #expect(executor.jobs.count == 0)
    }

    @Test("the executor is released once no primitive needs it")
    func executorReleased() {
        weak var weakExecutor: QueueSerialExecutor?
        let runs = Counter()
        do {
            let executor = QueueSerialExecutor()
            weakExecutor = executor
            _ = DelayedWork.schedule(after: .milliseconds(1), executor: executor) { runs.increment() }
            let cancelled = DelayedWork.schedule(after: .seconds(60), executor: executor) {}
            #expect(cancelled.cancel())
        }
        waitUntil { runs.count == 1 && weakExecutor == nil }
        #expect(weakExecutor == nil)
    }
}
