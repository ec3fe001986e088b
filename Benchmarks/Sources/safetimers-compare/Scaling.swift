import Dispatch
import Foundation
import NIOCore
import NIOEmbedded
import SafeTimers
import SafeTimersTesting
import Synchronization

/// The same guarded-section loop on several threads at once: nanoseconds per
/// section as each thread sees it (wall time / sections per thread). Flat from
/// one thread to two means it scales.
enum Parallel {
    ///
    /// The median of 5 rounds, each once the process is quiet: work a peer left
    /// behind (GCD cancels sources asynchronously, on its manager thread, for
    /// up to a second after 400k cancels) would otherwise take one of the two
    /// cores for part of a round, and a 2-thread round ran at one thread's speed
    /// about a time in two.
    static func nanosecondsPerOperation(threads: Int, iterations: Int, _ body: @escaping @Sendable () -> Void) -> Double
    {
        var rounds: [Double] = []
        for _ in 0..<5 {
            settle()
            rounds.append(oneRound(threads: threads, iterations: iterations, body))
        }
        return rounds.sorted()[rounds.count / 2]
    }

    /// Returns once the process used under 10 % of a core over 20 ms (at most
    /// after 3 s).
    static func settle() {
        func cpuNanoseconds() -> Int64 {
            var now = timespec()
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now)
            return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
        }
        for _ in 0..<150 {
            let before = cpuNanoseconds()
            usleep(20_000)
            if cpuNanoseconds() - before < 2_000_000 { return }
        }
    }

    private static func oneRound(threads: Int, iterations: Int, _ body: @escaping @Sendable () -> Void) -> Double {
        let group = DispatchGroup()
        let start = DispatchSemaphore(value: 0)
        for _ in 0..<threads {
            let thread = Thread {
                start.wait()
                for _ in 0..<iterations { body() }
                group.leave()
            }
            group.enter()
            thread.start()
        }
        let began = monotonicNanoseconds()
        for _ in 0..<threads { start.signal() }
        group.wait()
        return Double(monotonicNanoseconds() - began) / Double(iterations)
    }

    /// Wall nanoseconds per operation over all threads together (1000 / this is
    /// millions of operations per second): falling as threads are added means
    /// throughput scales.
    ///
    /// Each round runs every thread for the same wall time (not a fixed share of
    /// the operations): with more threads than cores, a round of fixed shares
    /// ends unevenly — the kernel gives each thread slices of a few ms, so the
    /// last thread or two finish alone on a half-idle machine, which a 20 ms round
    /// (2M guarded sections) counts as up to 15 % less throughput. The median of
    /// 5 rounds, each once the process is quiet.
    static func nanosecondsPerOperationOverall(
        threads: Int, milliseconds: Int, _ body: @escaping @Sendable () -> Void
    ) -> Double {
        var rounds: [Double] = []
        for _ in 0..<5 {
            settle()
            rounds.append(timedRound(threads: threads, milliseconds: milliseconds, body))
        }
        return rounds.sorted()[rounds.count / 2]
    }

    /// Operations a thread runs between two looks at the stop flag (a few µs).
    private static let batch = 64

    private static func timedRound(threads: Int, milliseconds: Int, _ body: @escaping @Sendable () -> Void) -> Double {
        let group = DispatchGroup()
        let start = DispatchSemaphore(value: 0)
        let stop = StopFlag()
        let counts = OperationCounts(threads: threads)
        for index in 0..<threads {
            let thread = Thread {
                start.wait()
                var done = 0
                while !stop.isSet {
                    for _ in 0..<batch { body() }
                    done += batch
                }
                counts.set(index, done)
                group.leave()
            }
            group.enter()
            thread.start()
        }
        let began = monotonicNanoseconds()
        for _ in 0..<threads { start.signal() }
        usleep(UInt32(milliseconds * 1000))
        stop.set()
        group.wait()
        // Until the last thread saw the flag and ended its batch (a thread off its
        // core when the flag was set ends its batch later; its operations count).
        let elapsed = Double(monotonicNanoseconds() - began)
        return elapsed / Double(counts.total)
    }

    static func delayedWorkOverall(threads: Int, milliseconds: Int) -> Double {
        nanosecondsPerOperationOverall(threads: threads, milliseconds: milliseconds) {
            DelayedWork.schedule(after: .seconds(10)) {}.cancel()
        }
    }

    static func asyncAfterOverall(threads: Int, milliseconds: Int) -> Double {
        let queue = DispatchQueue.global()
        defer {
            // The rounds' cancelled items come due 1 s later and GCD's threads
            // work them off then: without this wait, on the next row (one core
            // taken for part of each round: 2-thread withWatchdog read 26.5
            // ns/op overall, 11.3 when run alone).
            usleep(1_100_000)
            settle()
        }
        return nanosecondsPerOperationOverall(threads: threads, milliseconds: milliseconds) {
            let item = DispatchWorkItem {}
            // 1 s, not 10: GCD keeps a cancelled item until its deadline and then
            // works it off on its timer thread, which (400k of them, 10 s later)
            // landed on the lateness rows (asyncAfter p50: 650 ms).
            queue.asyncAfter(deadline: .now() + 1, execute: item)
            item.cancel()
        }
    }

    static func watchdogOverall(threads: Int, milliseconds: Int) -> Double {
        nanosecondsPerOperationOverall(threads: threads, milliseconds: milliseconds) {
            withWatchdog(timeout: .seconds(10), onTimeout: {}) { blackHole(0) }
        }
    }

    /// `withWatchdog` with a `queue:` argument (one serial queue all threads share).
    static func watchdogOnQueueOverall(threads: Int, milliseconds: Int) -> Double {
        let queue = DispatchQueue(label: "bench.parallel.watchdog.queue")
        return nanosecondsPerOperationOverall(threads: threads, milliseconds: milliseconds) {
            withWatchdog(timeout: .seconds(10), queue: queue, onTimeout: {}) { blackHole(0) }
        }
    }

    /// `DelayedWork` with an `on:` queue (one serial queue all threads share).
    static func delayedWorkOnQueueOverall(threads: Int, milliseconds: Int) -> Double {
        let queue = DispatchQueue(label: "bench.parallel.delayed.queue")
        return nanosecondsPerOperationOverall(threads: threads, milliseconds: milliseconds) {
            DelayedWork.schedule(after: .seconds(10), on: queue) {}.cancel()
        }
    }

    /// A `Watchdog` object created and invalidated around each section.
    static func watchdogObject(threads: Int, iterations: Int) -> Double {
        nanosecondsPerOperation(threads: threads, iterations: iterations) {
            let watchdog = Watchdog(timeout: .seconds(10), onTimeout: {})
            blackHole(0)
            watchdog.invalidate()
        }
    }

    /// A `DelayedWork` scheduled and cancelled, measured like ``watchdogObject(threads:iterations:)``.
    static func delayedWork(threads: Int, iterations: Int) -> Double {
        nanosecondsPerOperation(threads: threads, iterations: iterations) {
            DelayedWork.schedule(after: .seconds(10)) {}.cancel()
        }
    }

    static func dispatchSourceIdiomOverall(threads: Int, milliseconds: Int) -> Double {
        nanosecondsPerOperationOverall(
            threads: threads, milliseconds: milliseconds,
            sourceIdiom(DispatchQueue(label: "bench.parallel.watchdog.overall")))
    }

    static func watchdog(threads: Int, iterations: Int) -> Double {
        nanosecondsPerOperation(threads: threads, iterations: iterations) {
            withWatchdog(timeout: .seconds(10), onTimeout: {}) { blackHole(0) }
        }
    }

    static func dispatchSourceIdiom(threads: Int, iterations: Int) -> Double {
        nanosecondsPerOperation(
            threads: threads, iterations: iterations, sourceIdiom(DispatchQueue(label: "bench.parallel.watchdog")))
    }

    /// The GCD idiom for a guarded section: a `DispatchSourceTimer` per section.
    private static func sourceIdiom(_ queue: DispatchQueue) -> @Sendable () -> Void {
        {
            let source = DispatchSource.makeTimerSource(queue: queue)
            source.setEventHandler {}
            source.schedule(deadline: .now() + 10)
            source.resume()
            blackHole(0)
            source.cancel()
        }
    }
}

/// Virtual time: SafeTimers' `ManualTimerScheduler` against swift-nio's
/// `EmbeddedEventLoop`, the synchronous manual clock Swift server code tests with.
/// Milliseconds of real time per scenario.
enum VirtualTime {
    /// One hour of a 30 s repeating timer: 120 handler calls.
    static func manualHour() -> (Double, Int) {
        var fired = 0
        let milliseconds = measureMilliseconds {
            let manual = ManualTimerScheduler()
            let counter = CountingBox()
            let timer = RepeatingTimer(interval: .seconds(30), scheduler: manual) { counter.add() }
            timer.start()
            manual.advance(by: .seconds(3600))
            timer.cancel()
            fired = counter.value
        }
        return (milliseconds, fired)
    }

    static func embeddedHour() -> (Double, Int) {
        var fired = 0
        let milliseconds = measureMilliseconds {
            let loop = EmbeddedEventLoop()
            let counter = CountingBox()
            let task = loop.scheduleRepeatedTask(initialDelay: .seconds(30), delay: .seconds(30)) { _ in
                counter.add()
            }
            loop.advanceTime(by: .seconds(3600))
            task.cancel()
            fired = counter.value
            try? loop.syncShutdownGracefully()
        }
        return (milliseconds, fired)
    }

    /// `count` one-shot timers at spread deadlines within an hour, all fired by one advance.
    static func manualEvents(count: Int) -> (Double, Int) {
        let manual = ManualTimerScheduler()
        let counter = CountingBox()
        var generator = SystemRandomNumberGenerator()
        let delays = (0..<count).map { _ in Int64.random(in: 1...3_600_000_000_000, using: &generator) }
        var works: [DelayedWork] = []
        works.reserveCapacity(count)
        let milliseconds = measureMilliseconds {
            for delay in delays {
                works.append(DelayedWork.schedule(after: .nanoseconds(delay), scheduler: manual) { counter.add() })
            }
            manual.advance(by: .seconds(3600))
        }
        return (milliseconds, counter.value)
    }

    static func embeddedEvents(count: Int) -> (Double, Int) {
        let loop = EmbeddedEventLoop()
        let counter = CountingBox()
        var generator = SystemRandomNumberGenerator()
        let delays = (0..<count).map { _ in Int64.random(in: 1...3_600_000_000_000, using: &generator) }
        let milliseconds = measureMilliseconds {
            for delay in delays {
                loop.scheduleTask(in: .nanoseconds(delay)) { counter.add() }
            }
            loop.advanceTime(by: .seconds(3600))
        }
        try? loop.syncShutdownGracefully()
        return (milliseconds, counter.value)
    }

    static func measureMilliseconds(_ body: () -> Void) -> Double {
        let began = monotonicNanoseconds()
        body()
        return Double(monotonicNanoseconds() - began) / 1_000_000
    }
}

/// Set once by the thread that times a round; read by its workers between batches.
private final class StopFlag: @unchecked Sendable {
    // `@unchecked Sendable` invariant: the one stored property is an atomic.
    private let flag = Atomic<Bool>(false)
    var isSet: Bool { flag.load(ordering: .relaxed) }
    func set() { flag.store(true, ordering: .relaxed) }
}

/// Each worker's operation count, written once by that worker before it leaves
/// the round's group (the group's wait orders the reads after the writes).
private final class OperationCounts: @unchecked Sendable {
    // `@unchecked Sendable` invariant: slot i is written only by worker i, once,
    // before `group.leave()`; `total` is read only after `group.wait()`.
    private var counts: [Int]
    init(threads: Int) { counts = Array(repeating: 0, count: threads) }
    func set(_ index: Int, _ count: Int) { counts[index] = count }
    var total: Int { counts.reduce(0, +) }
}

/// A counter for handlers that run on the advancing thread.
final class CountingBox: @unchecked Sendable {
    // `@unchecked Sendable` invariant: only used by virtual-time scenarios, whose
    // handlers all run on the one thread that advances the clock.
    private(set) var value = 0
    func add() { value += 1 }
}
