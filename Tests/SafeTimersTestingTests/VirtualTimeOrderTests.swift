import SafeTimersTesting
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// Virtual time runs everything in one total order: deadline first, then the
/// order of arming; work armed during an advance for an instant already reached
/// (the zero-delay rule) runs at the next instant the advance reaches, still in
/// that order, and is pending, counted and cancellable like any other.
@Suite("Virtual time: one total order, counted and cancellable")
struct VirtualTimeOrderTests {
    /// What ran, in order.
    private final class Log: Sendable {
        private let names = StateLock<[String]>([])
        func append(_ name: String) { names.withLock { $0.append(name) } }
        var all: [String] { names.withLock { $0 } }
    }

    @Test("swift-nio's task ordering: zero-delay work armed at 5 ns runs before the entry due at 10 ns")
    func nioTaskOrdering() {
        let manual = ManualTimerScheduler()
        let log = Log()
        var works: [DelayedWork] = []
        works.append(DelayedWork.schedule(after: .zero, scheduler: manual) { log.append("execute") })
        for name in ["first", "second"] {
            works.append(
                DelayedWork.schedule(after: .nanoseconds(5), scheduler: manual) {
                    log.append(name)
                    _ = DelayedWork.schedule(after: .zero, scheduler: manual) { log.append("\(name)'s execute") }
                })
        }
        works.append(DelayedWork.schedule(after: .nanoseconds(10), scheduler: manual) { log.append("10ns") })
        manual.advance(by: .nanoseconds(10))
        #expect(log.all == ["execute", "first", "second", "first's execute", "second's execute", "10ns"])
        #expect(manual.pendingCount == 0)
    }

    @Test("work armed during an advance for an instant already passed, then cancelled, is no longer pending")
    func cancelledDeferredWorkIsNotPending() {
        let manual = ManualTimerScheduler()
        let log = Log()
        let armed = StateLock<DelayedWork?>(nil)
        let cancelled = StateLock<Bool?>(nil)
        let a = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            let past = manual.instant.advanced(by: .milliseconds(-500))
            armed.withLock { $0 = DelayedWork.schedule(at: past, scheduler: manual) { log.append("past") } }
        }
        let b = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            cancelled.withLock { $0 = armed.withLock { $0 }?.cancel() }
        }
        manual.advance(by: .seconds(1))
        #expect(cancelled.withLock { $0 } == true)
        #expect(manual.pendingCount == 0)
        manual.advance(by: .seconds(1))
        #expect(log.all.isEmpty)
        #expect(manual.pendingCount == 0)
        _ = (a, b)
    }

    @Test("work rescheduled during an advance into the past, then cancelled, is no longer pending")
    func cancelledRescheduledWorkIsNotPending() {
        let manual = ManualTimerScheduler()
        let log = Log()
        let later = DelayedWork.schedule(after: .seconds(10), scheduler: manual) { log.append("later") }
        let cancelled = StateLock<Bool?>(nil)
        let a = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            later.reschedule(at: manual.instant.advanced(by: .milliseconds(-500)))
        }
        let b = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            cancelled.withLock { $0 = later.cancel() }
        }
        manual.advance(by: .seconds(1))
        #expect(cancelled.withLock { $0 } == true)
        #expect(manual.pendingCount == 0)
        manual.advance(by: .seconds(20))
        #expect(log.all.isEmpty)
        _ = (a, b)
    }
}
