import Dispatch
import SafeTimers
import Synchronization
import Testing

@testable import StallDetection

#if canImport(Glibc)
import Glibc
#endif

@Suite("DetectorWorker: a detector's serial thread of its own")
struct DetectorWorkerTests {
    @Test("jobs from 8 threads run once each, one at a time, each thread's in the order it gave them")
    func orderAndExclusion() {
        let worker = DetectorWorker(name: "WorkerOrder")
        let running = Atomic<Int>(0)
        let overlaps = Atomic<Int>(0)
        let seen = Locked<[[Int]]>(Array(repeating: [], count: 8))
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            for number in 0..<200 {
                worker.async {
                    if running.add(1, ordering: .relaxed).newValue > 1 { overlaps.add(1, ordering: .relaxed) }
                    seen.withLock { $0[thread].append(number) }
                    running.subtract(1, ordering: .relaxed)
                }
            }
        }
        worker.sync {}
        #expect(overlaps.load(ordering: .relaxed) == 0)
        #expect(seen.withLock { $0 } == Array(repeating: Array(0..<200), count: 8))
    }

    @Test("sync returns the job's value after the jobs before it; from a job it runs at once, on the worker")
    func syncFromOutsideAndInside() {
        let worker = DetectorWorker(name: "WorkerSync")
        let done = Atomic<Bool>(false)
        worker.async {
            usleep(20_000)
            done.store(true, ordering: .relaxed)
        }
        let value = worker.sync { done.load(ordering: .relaxed) ? 42 : 0 }
        #expect(value == 42)
        let nested = worker.sync { () -> (Bool, Int) in
            (worker.isCurrent, worker.sync { 7 })
        }
        #expect(nested == (true, 7))
        #expect(!worker.isCurrent)
    }

    @Test("an idle worker ends its thread; the next job starts another, and nothing submitted meanwhile is lost")
    func idleThreadEnds() {
        let worker = DetectorWorker(name: "WorkerIdle", idleLifetime: .milliseconds(1))
        worker.sync {}
        #expect(worker.threadsStarted == 1)
        let deadline = Monotonic.now() + 2_000_000_000
        while worker.hasThread, Monotonic.now() < deadline { usleep(1_000) }
        #expect(!worker.hasThread, "the thread still runs after 2 s idle")
        // Jobs given while the thread is about to end, or just ended.
        let ran = Atomic<Int>(0)
        let all = DispatchSemaphore(value: 0)
        for round in 0..<300 {
            usleep(UInt32(round % 4) * 400)
            worker.async {
                if ran.add(1, ordering: .relaxed).newValue == 300 { all.signal() }
            }
        }
        #expect(all.wait(timeout: .now() + 10) == .success, "\(ran.load(ordering: .relaxed)) of 300 ran")
        #expect(worker.threadsStarted > 1, "the thread never ended between jobs")
    }

    @Test("a DelayedWork scheduled with the worker as its executor runs on the worker")
    func runsDelayedWork() {
        let worker = DetectorWorker(name: "WorkerDelayed")
        let onWorker = Locked<[Bool]>([])
        let done = DispatchSemaphore(value: 0)
        var works: [DelayedWork] = []
        for milliseconds in [1, 5, 10] {
            works.append(
                DelayedWork.schedule(after: .milliseconds(milliseconds), executor: worker) {
                    onWorker.withLock { $0.append(worker.isCurrent) }
                    done.signal()
                })
        }
        for _ in works { #expect(done.wait(timeout: .now() + 5) == .success) }
        #expect(onWorker.withLock { $0 } == [true, true, true])
    }

    @Test("its thread carries the worker's name (as gdb and /proc show it)")
    func threadOfItsOwn() {
        let worker = DetectorWorker(name: "WorkerNamed")
        let name = worker.sync { currentThreadName() }
        #expect(name == "WorkerNamed")
    }
}

/// The calling thread's name, as `/proc` shows it.
func currentThreadName() -> String {
    guard let file = fopen("/proc/thread-self/comm", "r") else { return "" }
    defer { fclose(file) }
    var buffer = [CChar](repeating: 0, count: 32)
    guard fgets(&buffer, Int32(buffer.count), file) != nil else { return "" }
    return String(decoding: buffer.prefix { $0 != 0 && $0 != 10 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
