import Dispatch
import Foundation
import StallDetection
import Synchronization

// An idle event loop that waits for a core is no stall; one asleep in its own job
// is. `starved-loop [rounds]` watches an event loop with a thread of its own, at
// nice 19, as `.custom`. Each round (default 3): for 2 s, four threads per core
// spin at nice 0 while the loop is idle, so that each probe the loop is woken for
// waits for a core, hundreds of milliseconds at times; then, the spinners gone,
// the loop sleeps 700 ms in `starvedLoopJob`. Extra output lines:
//   STARVED <round> <begin|end> <monotonic ms>   the spinners' span
//   JOB <round> <begin|end> <monotonic ms>       the loop's own job
//   LOOPWAIT <max ms>                            the longest a probe waited to run while the spinners ran
//   DONE

/// An event loop with a thread of its own: jobs queue under a condition, and the
/// thread waits for them.
final class ThreadLoop: @unchecked Sendable {
    // Invariant: `jobs` is read and written only with `condition` locked.
    private let condition = NSCondition()
    private var jobs: [@Sendable () -> Void] = []

    /// Starts the loop's thread at `nice`.
    init(name: String, nice: Int32) {
        let thread = Thread { [self] in
            // Linux keeps the nice value per thread: 0 is the calling thread.
            #if canImport(Glibc)
            setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, nice)
            #else
            setpriority(PRIO_PROCESS, 0, nice)
            #endif
            run()
        }
        thread.name = name
        thread.start()
    }

    func execute(_ job: @escaping @Sendable () -> Void) {
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    private func run() -> Never {
        while true {
            condition.lock()
            while jobs.isEmpty { condition.wait() }
            let next = jobs.removeFirst()
            condition.unlock()
            next()
        }
    }
}

/// 700 ms asleep in a function whose name the report must show.
@inline(never)
func starvedLoopJob() {
    let end = ContinuousClock.now + .milliseconds(700)
    while ContinuousClock.now < end { usleep(10_000) }
}

/// Four spinning threads per core for `milliseconds`, at nice 0.
func spinEveryCore(milliseconds: Int) {
    let group = DispatchGroup()
    for _ in 0..<(4 * ProcessInfo.processInfo.activeProcessorCount) {
        group.enter()
        Thread {
            let end = ContinuousClock.now + .milliseconds(milliseconds)
            var spins = 0
            while ContinuousClock.now < end { spins &+= 1 }
            blackHole(spins)
            group.leave()
        }.start()
    }
    group.wait()
}

func runStarvedLoop(rounds: Int) {
    let loop = ThreadLoop(name: "starved-loop", nice: 19)
    let longestWait = Mutex(0.0)
    let detector = StallDetector(
        target: .custom(name: "starved loop") { probe in
            let posted = monotonicMilliseconds()
            loop.execute {
                let waited = monotonicMilliseconds() - posted
                longestWait.withLock { $0 = max($0, waited) }
                probe()
            }
        },
        threshold: .milliseconds(250), onEvent: report)
    detector.start()
    Thread.sleep(forTimeInterval: 1)
    for round in 1...max(1, rounds) {
        emit("STARVED \(round) begin \(monotonicMilliseconds())")
        spinEveryCore(milliseconds: 2_000)
        emit("STARVED \(round) end \(monotonicMilliseconds())")
        Thread.sleep(forTimeInterval: 0.5)
        let done = DispatchSemaphore(value: 0)
        loop.execute {
            emit("JOB \(round) begin \(monotonicMilliseconds())")
            starvedLoopJob()
            emit("JOB \(round) end \(monotonicMilliseconds())")
            done.signal()
        }
        done.wait()
        Thread.sleep(forTimeInterval: 1)
    }
    detector.stop()
    emit("LOOPWAIT \(longestWait.withLock { $0 })")
    emit("DONE")
    exit(0)
}
