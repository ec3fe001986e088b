import Dispatch
import SafeTimersTesting
import Synchronization
import Testing

@testable import SafeTimers

/// An object whose captures can be watched: `deinit` flips a shared flag.
final class Tracked: Sendable {
    let onDeinit: @Sendable () -> Void
    init(onDeinit: @escaping @Sendable () -> Void = {}) { self.onDeinit = onDeinit }
    deinit { onDeinit() }
    func touch() {}
}

@Suite("DelayedWork (virtual time)")
struct DelayedWorkTests {
    @Test("runs exactly at its deadline, once, and then reports completed")
    func runsAtDeadline() {
        let manual = ManualTimerScheduler()
        let runs = Counter()
        let work = DelayedWork.schedule(after: .seconds(2), scheduler: manual) { runs.increment() }
        #expect(work.state == .pending)
        manual.advance(by: .milliseconds(1999))
        #expect(runs.count == 0)
        manual.advance(by: .milliseconds(1))
        #expect(runs.count == 1)
        #expect(work.state == .completed)
        manual.advance(by: .seconds(10))
        #expect(runs.count == 1)
        #expect(work.cancel() == false)
    }

    @Test("cancel before the deadline prevents the run and releases the captures before it returns")
    func cancelReleasesCaptures() {
        let manual = ManualTimerScheduler()
        let released = Counter()
        let runs = Counter()
        let work: DelayedWork = {
            let captured = Tracked { released.increment() }
            return DelayedWork.schedule(after: .seconds(2), scheduler: manual) {
                captured.touch()
                runs.increment()
            }
        }()
        #expect(released.count == 0)
        #expect(work.cancel() == true)
        #expect(released.count == 1, "the capture must be gone when cancel() returns")
        #expect(work.state == .cancelled)
        #expect(manual.pendingCount == 0)
        #expect(work.cancel() == false, "a second cancel did not prevent anything")
        manual.advance(by: .seconds(5))
        #expect(runs.count == 0)
    }

    @Test("the closure is released right after it runs, while the handle lives on")
    func releasedAfterRun() {
        let manual = ManualTimerScheduler()
        let released = Counter()
        let work: DelayedWork = {
            let captured = Tracked { released.increment() }
            return DelayedWork.schedule(after: .seconds(1), scheduler: manual) { captured.touch() }
        }()
        manual.advance(by: .seconds(1))
        #expect(released.count == 1)
        #expect(work.state == .completed)
    }

    @Test("cancel from inside the closure returns false at once and does not deadlock")
    func cancelFromInside() {
        let manual = ManualTimerScheduler()
        let handle = StateLock<DelayedWork?>(nil)
        let result = StateLock<Bool?>(nil)
        let work = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            let work = handle.withLock { $0 }
            let state = work?.state
            result.withLock { $0 = work?.cancel() }
            #expect(state == .running)
        }
        handle.withLock { $0 = work }
        manual.advance(by: .seconds(1))
        #expect(result.withLock { $0 } == false)
        #expect(work.state == .completed)
    }

    @Test("zero and negative delays run at the next advance; an overflowing delay never runs")
    func badDelays() {
        let manual = ManualTimerScheduler()
        let runs = Counter()
        _ = DelayedWork.schedule(after: .zero, scheduler: manual) { runs.increment() }
        _ = DelayedWork.schedule(after: .seconds(-30), scheduler: manual) { runs.increment() }
        let never = DelayedWork.schedule(after: .seconds(Int64.max), scheduler: manual) { runs.increment() }
        manual.advance(by: .zero)
        #expect(runs.count == 2)
        manual.advance(by: .seconds(Int64.max))
        #expect(runs.count == 2)
        #expect(never.state == .pending)
        #expect(never.cancel())
        #expect(manual.pendingCount == 0)
    }

    @Test("many items run in deadline order, equal deadlines in scheduling order")
    func ordering() {
        let manual = ManualTimerScheduler()
        let log = FireLog()
        let items = [("c", 3), ("a", 1), ("b1", 2), ("b2", 2)].map { name, seconds in
            DelayedWork.schedule(after: .seconds(seconds), scheduler: manual) { log.record(name) }
        }
        manual.advance(by: .seconds(3))
        #expect(log.names == ["a", "b1", "b2", "c"])
        #expect(items.allSatisfy { $0.state == .completed })
    }
}
