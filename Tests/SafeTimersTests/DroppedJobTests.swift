import Foundation
import Testing

@testable import SafeTimers

/// A `SerialExecutor` that never runs the jobs it is given, as a SwiftNIO event
/// loop that has been shut down drops what is enqueued on it.
final class DroppingSerialExecutor: SerialExecutor {
    let jobs = Counter()

    func enqueue(_ job: consuming ExecutorJob) {
        jobs.increment()
    }
}

/// Something a handler captures, to tell when the handler is released.
private final class Capture: Sendable {}

/// Handlers for an executor that never runs its jobs (a shut-down event loop's):
/// what the primitives do with a delivery that never begins. (The task of a
/// dropped job is never freed, and keeps the executor object alive; that is not
/// checked here, only what `cancel()` promises.)
@Suite("Handlers on an executor that drops its jobs")
struct DroppedJobTests {
    @Test("a DelayedWork delivered to a dropping executor: no crash, never runs, cancel() returns, captures released")
    func delayedWork() {
        let executor = DroppingSerialExecutor()
        let runs = Counter()
        weak var weakCapture: Capture?
        var work: DelayedWork?
        do {
            let capture = Capture()
            weakCapture = capture
            work = DelayedWork.schedule(after: .milliseconds(1), executor: executor) {
                _ = capture
                runs.increment()
            }
        }
        waitUntil { executor.jobs.count == 1 }
        #expect(executor.jobs.count == 1)
        let prevented = work?.cancel()
        #expect(prevented == true, "a delivery that never began is prevented by cancel()")
        work = nil
        #expect(runs.count == 0)
        #expect(weakCapture == nil, "the handler's captures are released by cancel()")
    }

    @Test("a RepeatingTimer on a dropping executor: one job outstanding at a time, cancel() returns, captures released")
    func repeatingTimer() {
        let executor = DroppingSerialExecutor()
        let runs = Counter()
        weak var weakCapture: Capture?
        var timer: RepeatingTimer?
        do {
            let capture = Capture()
            weakCapture = capture
            timer = RepeatingTimer(interval: .milliseconds(2), executor: executor) {
                _ = capture
                runs.increment()
            }
            timer?.start()
        }
        waitUntil { executor.jobs.count >= 1 }
        usleep(50_000)
        let jobs = executor.jobs.count
        timer?.cancel()
        timer = nil
        #expect(runs.count == 0)
        #expect(jobs == 1, "\(jobs) jobs for 25 ticks")
        #expect(weakCapture == nil, "the handler's captures are released by cancel()")
    }
}
