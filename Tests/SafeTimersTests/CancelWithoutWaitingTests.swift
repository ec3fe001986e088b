import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// `DelayedWork.cancelWithoutWaiting()`: the cancel for event-loop threads. It says
/// exactly what it found and never waits; where it stops the run it is the same
/// barrier as `cancel()`.
@Suite("DelayedWork.cancelWithoutWaiting")
struct CancelWithoutWaitingTests {
    @Test("a pending work: prevented, the captures released before it returns, then alreadyCancelled")
    func pending() {
        let manual = ManualTimerScheduler()
        let released = Counter()
        let runs = Counter()
        let work: DelayedWork = {
            let captured = Tracked { released.increment() }
            return DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
                captured.touch()
                runs.increment()
            }
        }()
        #expect(work.cancelWithoutWaiting() == .prevented)
        #expect(released.count == 1)
        #expect(work.state == .cancelled)
        #expect(work.cancelWithoutWaiting() == .alreadyCancelled)
        #expect(work.cancel() == false)
        manual.advance(by: .seconds(2))
        #expect(runs.count == 0)
    }

    @Test("due and delivered but not begun: prevented, and the delivery finds nothing to run")
    func dueNotBegun() {
        let recorder = DeliveryRecorder()
        let engine = TimerEngine(virtual: true)
        let runs = Counter()
        let work = DelayedWork.schedule(atTicks: 1_000, executor: .recorder(recorder), engine: engine) {
            runs.increment()
        }
        engine.advance(toTicks: 1_000)
        let deliveries = recorder.takeAll()
        #expect(deliveries.count == 1)
        #expect(work.cancelWithoutWaiting() == .prevented)
        for delivery in deliveries { delivery.target.invoke(tag: delivery.tag) }
        #expect(runs.count == 0)
        #expect(work.state == .cancelled)
    }

    @Test("a completed work: completed")
    func completed() {
        let manual = ManualTimerScheduler()
        let work = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {}
        manual.advance(by: .seconds(1))
        #expect(work.cancelWithoutWaiting() == .completed)
        #expect(work.state == .completed)
    }

    @Test("from inside the closure: running, at once")
    func fromInside() {
        let manual = ManualTimerScheduler()
        let outcome = StateLock<DelayedWork.CancelOutcome?>(nil)
        let handle = StateLock<DelayedWork?>(nil)
        let work = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            let work = handle.withLock { $0 }
            outcome.withLock { $0 = work?.cancelWithoutWaiting() }
        }
        handle.withLock { $0 = work }
        manual.advance(by: .seconds(1))
        #expect(outcome.withLock { $0 } == .running)
        #expect(work.state == .completed)
        handle.withLock { $0 = nil }
    }

    @Test("running on another thread: running, without waiting for the closure, which finishes")
    func runningElsewhere() {
        let started = DispatchSemaphore(value: 0)
        let proceed = DispatchSemaphore(value: 0)
        let finished = Counter()
        let work = DelayedWork.schedule(after: .zero) {
            started.signal()
            _ = proceed.wait(timeout: .now() + 30)
            finished.increment()
        }
        #expect(started.wait(timeout: .now() + 30) == .success)
        // The closure is blocked until `proceed`: a cancel that waited would hang here.
        #expect(work.cancelWithoutWaiting() == .running)
        #expect(finished.count == 0)
        #expect(work.state == .running)
        proceed.signal()
        // `cancel()` is still the barrier: it waits for the closure to return.
        #expect(work.cancel() == false)
        #expect(finished.count == 1)
        #expect(work.cancelWithoutWaiting() == .completed)
    }

    @Test("racing the deadline from many threads: exactly one outcome is prevented or the run happens, never both")
    func racingTheDeadline() {
        for _ in 0..<200 {
            let runs = Counter()
            let work = DelayedWork.schedule(after: .microseconds(50)) { runs.increment() }
            let outcomes = StateLock<[DelayedWork.CancelOutcome]>([])
            DispatchQueue.concurrentPerform(iterations: 4) { _ in
                usleep(UInt32.random(in: 0...120))  // around the deadline
                let outcome = work.cancelWithoutWaiting()
                outcomes.withLock { $0.append(outcome) }
            }
            _ = work.cancel()  // the barrier: after it, the run either happened or never will
            let all = outcomes.withLock { $0 }
            let prevented = all.filter { $0 == .prevented }.count
            #expect(prevented <= 1)
            #expect(prevented + runs.count == 1, "outcomes \(all), runs \(runs.count)")
        }
    }
}
