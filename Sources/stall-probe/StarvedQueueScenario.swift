import Dispatch
import Foundation
import StallDetection
import Synchronization

// A serial queue in a process at nice 19 beside busy threads at nice 0:
// `starved-queue [rounds]`. Four threads per core are started first (the
// spinners, left at nice 0), then every other thread is reniced to 19; the pool's
// workers and the detector's threads made later inherit it (the detector's queues
// run on the same pool as the watched queue). Each round (default 3): for 2 s the
// spinners and, at nice 19, a busy thread per core of the process's own run, while
// blocks of the scenario's own measure how long the queue's work waits to run;
// then the queue sleeps 700 ms in `starvedQueueJob`. The detector waits for a core
// as the queue's workers do, so this is the whole process starved, not one target.
// Extra output lines as in `starved-loop`:
//   STARVED <round> <begin|end> <monotonic ms>
//   JOB <round> <begin|end> <monotonic ms>
//   QUEUEWAIT <max ms>   the longest a block posted to the queue waited to run while the spinners ran
//   THREADS <n>          how many pool threads ran those blocks
//   DONE

/// 700 ms asleep in a function whose name the report must show.
@inline(never)
func starvedQueueJob() {
    let end = ContinuousClock.now + .milliseconds(700)
    while ContinuousClock.now < end { usleep(10_000) }
}

/// Sets every thread of this process but `spared` to `nice` (Linux keeps it per
/// thread; a thread created later inherits its creator's).
func reniceEveryThread(_ nice: Int32, but spared: Set<Int32>) {
    #if os(Linux)
    let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    for thread in threads.compactMap({ id_t($0) }) where !spared.contains(Int32(bitPattern: thread)) {
        setpriority(__priority_which_t(PRIO_PROCESS.rawValue), thread, nice)
    }
    #endif
}

/// Four spinning threads per core at nice 0, started before the rest of the process
/// is reniced, idle until `spin` lets them run.
final class SpinnerThreads: Sendable {
    private let spinning = Atomic(false)
    private let gate = DispatchSemaphore(value: 0)
    private let count = 4 * ProcessInfo.processInfo.activeProcessorCount
    /// Their kernel thread ids, which `reniceEveryThread` leaves at nice 0.
    let ids = Mutex<Set<Int32>>([])

    init() {
        let started = DispatchSemaphore(value: 0)
        for _ in 0..<count {
            Thread { [self] in
                ids.withLock { _ = $0.insert(currentThreadID()) }
                started.signal()
                while true {
                    gate.wait()
                    var spins = 0
                    while spinning.load(ordering: .relaxed) { spins &+= 1 }
                    blackHole(spins)
                }
            }.start()
        }
        for _ in 0..<count { started.wait() }
    }

    func spin(milliseconds: Int) {
        spinning.store(true, ordering: .relaxed)
        for _ in 0..<count { gate.signal() }
        Thread.sleep(forTimeInterval: Double(milliseconds) / 1000)
        spinning.store(false, ordering: .relaxed)
    }
}

/// The calling thread's kernel id, from `/proc/thread-self` (0 where there is none).
func currentThreadID() -> Int32 {
    let link = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/thread-self")) ?? ""
    return link.split(separator: "/").last.flatMap { Int32($0) } ?? 0
}

func runStarvedQueue(rounds: Int) {
    let spinners = SpinnerThreads()
    reniceEveryThread(19, but: spinners.ids.withLock { $0 })
    let queue = DispatchQueue(label: "starved-queue")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250), onEvent: report)
    detector.start()
    Thread.sleep(forTimeInterval: 1)
    let longestWait = Mutex(0.0)
    let answeringThreads = Mutex(Set<String>())
    for round in 1...max(1, rounds) {
        emit("STARVED \(round) begin \(monotonicMilliseconds())")
        // While the spinners run, blocks of our own measure how long the queue's
        // work waits for a core (the probes do likewise, unseen).
        let measuring = Atomic(true)
        Thread {
            while measuring.load(ordering: .relaxed) {
                let posted = monotonicMilliseconds()
                let ran = DispatchSemaphore(value: 0)
                queue.async {
                    longestWait.withLock { $0 = max($0, monotonicMilliseconds() - posted) }
                    answeringThreads.withLock { _ = $0.insert("\(pthread_self())") }
                    ran.signal()
                }
                ran.wait()
                usleep(50_000)
            }
        }.start()
        // Busy threads of this process's own, so that it runs (at nice 19) while
        // the queue's worker waits: the CPU time alone does not clear a late answer.
        let busy = DispatchGroup()
        for _ in 0..<ProcessInfo.processInfo.activeProcessorCount {
            busy.enter()
            Thread {
                var spins = 0
                while measuring.load(ordering: .relaxed) { spins &+= 1 }
                blackHole(spins)
                busy.leave()
            }.start()
        }
        spinners.spin(milliseconds: 2_000)
        measuring.store(false, ordering: .relaxed)
        busy.wait()
        emit("STARVED \(round) end \(monotonicMilliseconds())")
        Thread.sleep(forTimeInterval: 0.5)
        let done = DispatchSemaphore(value: 0)
        queue.async {
            emit("JOB \(round) begin \(monotonicMilliseconds())")
            starvedQueueJob()
            emit("JOB \(round) end \(monotonicMilliseconds())")
            done.signal()
        }
        done.wait()
        Thread.sleep(forTimeInterval: 1)
    }
    detector.stop()
    emit("QUEUEWAIT \(longestWait.withLock { $0 })")
    emit("THREADS \(answeringThreads.withLock { $0.count })")
    emit("DONE")
    exit(0)
}
