import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable import SafeTimers

@Suite("Watchdog (virtual time)")
struct WatchdogTests {
    @Test("fires once at the timeout when not invalidated")
    func firesAtTimeout() {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        let dog = Watchdog(timeout: .seconds(2), scheduler: manual) { fired.increment() }
        manual.advance(by: .milliseconds(1999))
        #expect(fired.count == 0)
        #expect(!dog.hasFired)
        manual.advance(by: .milliseconds(1))
        #expect(fired.count == 1)
        #expect(dog.hasFired)
        manual.advance(by: .seconds(60))
        #expect(fired.count == 1)
        #expect(manual.pendingCount == 0)
    }

    @Test("invalidate before the timeout: no firing, handler released, idempotent")
    func invalidate() {
        let manual = ManualTimerScheduler()
        let released = Counter()
        let fired = Counter()
        let dog: Watchdog = {
            let captured = Tracked { released.increment() }
            return Watchdog(timeout: .seconds(2), scheduler: manual) {
                captured.touch()
                fired.increment()
            }
        }()
        dog.invalidate()
        #expect(released.count == 1)
        dog.invalidate()
        manual.advance(by: .seconds(5))
        #expect(fired.count == 0)
        #expect(!dog.hasFired)
        #expect(manual.pendingCount == 0)
    }

    @Test("kick moves the deadline to now + timeout; after firing it has no effect")
    func kick() {
        let manual = ManualTimerScheduler()
        let firedAt = StateLock<[Duration]>([])
        let dog = Watchdog(timeout: .seconds(2), scheduler: manual) {
            firedAt.withLock { $0.append(manual.now) }
        }
        manual.advance(by: .milliseconds(1500))
        dog.kick()  // deadline 3.5 s
        manual.advance(by: .milliseconds(1500))  // 3.0 s
        dog.kick()  // deadline 5.0 s
        manual.advance(by: .milliseconds(1999))
        #expect(firedAt.withLock { $0 }.isEmpty)
        manual.advance(by: .milliseconds(1))
        #expect(firedAt.withLock { $0 } == [.seconds(5)])
        dog.kick()
        manual.advance(by: .seconds(10))
        #expect(firedAt.withLock { $0 } == [.seconds(5)])
    }

    @Test("a kick at the deadline, before the engine has delivered it, is refused and the watchdog fires there")
    func kickAtTheDeadlineIsRefused() {
        let manual = ManualTimerScheduler()
        let firedAt = StateLock<[Duration]>([])
        let kicked = StateLock<Bool?>(nil)
        let box = StateLock<Watchdog?>(nil)
        // Armed before the watchdog at its deadline: runs first at that instant,
        // when the clock has reached the deadline but the watchdog is not delivered yet.
        let work = DelayedWork.schedule(after: .seconds(2), scheduler: manual) {
            let dog = box.withLock { $0 }
            kicked.withLock { $0 = dog?.kick() }
        }
        let dog = Watchdog(timeout: .seconds(2), scheduler: manual) {
            firedAt.withLock { $0.append(manual.now) }
        }
        box.withLock { $0 = dog }
        manual.advance(by: .seconds(2))
        #expect(kicked.withLock { $0 } == false)
        #expect(firedAt.withLock { $0 } == [.seconds(2)])
        #expect(dog.hasFired)
        #expect(dog.kick(timeout: .seconds(9)) == false)
        manual.advance(by: .seconds(10))
        #expect(firedAt.withLock { $0 } == [.seconds(2)])
        #expect(work.state == .completed)
    }

    @Test("the state machine refuses a kick at or after the deadline, whatever the engine has delivered")
    func machineRefusesLateKick() {
        var machine = WatchdogStateMachine(timeout: .nanoseconds(100))
        #expect(machine.arm(now: 0) {}.timer == .arm(100))
        #expect(machine.kick(now: 99).movedDeadline)
        #expect(machine.deadline == 199)
        #expect(!machine.kick(now: 199).movedDeadline)
        #expect(!machine.kick(now: 10_000, timeout: .seconds(1)).movedDeadline)
        #expect(machine.deadline == 199)
        #expect(machine.timeoutDuration == .nanoseconds(100))
    }

    @Test("releasing the watchdog invalidates it")
    func deinitInvalidates() {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        do {
            _ = Watchdog(timeout: .seconds(1), scheduler: manual) { fired.increment() }
        }
        manual.advance(by: .seconds(2))
        #expect(fired.count == 0)
        #expect(manual.pendingCount == 0)
    }

    @Test("zero and negative timeouts fire at the next advance; an overflowing one never")
    func badTimeouts() {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        let zero = Watchdog(timeout: .zero, scheduler: manual) { fired.increment() }
        let negative = Watchdog(timeout: .seconds(-1), scheduler: manual) { fired.increment() }
        let never = Watchdog(timeout: .seconds(Int64.max), scheduler: manual) { fired.increment() }
        never.kick()
        manual.advance(by: .zero)
        #expect(fired.count == 2)
        #expect(zero.hasFired && negative.hasFired)
        manual.advance(by: .seconds(Int64.max))
        #expect(!never.hasFired)
    }

    @Test("invalidate from inside the handler returns at once")
    func invalidateFromInside() {
        let manual = ManualTimerScheduler()
        let box = StateLock<Watchdog?>(nil)
        let dog = Watchdog(timeout: .seconds(1), scheduler: manual) {
            box.withLock { $0 }?.invalidate()
        }
        box.withLock { $0 = dog }
        manual.advance(by: .seconds(1))
        #expect(dog.hasFired)
        box.withLock { $0 = nil }
    }

    @Test("withWatchdog: a fast body stays silent, a slow body is reported while it runs")
    func scopedSync() throws {
        let manual = ManualTimerScheduler()
        let reports = Counter()
        let fast = withWatchdog(timeout: .seconds(1), scheduler: manual, onTimeout: { reports.increment() }) {
            manual.advance(by: .milliseconds(500))
            return 1
        }
        #expect(fast == 1)
        #expect(reports.count == 0)
        let slow = withWatchdog(timeout: .seconds(1), scheduler: manual, onTimeout: { reports.increment() }) {
            manual.advance(by: .milliseconds(1500))
            #expect(reports.count == 1, "reported while the body is still running")
            return 2
        }
        #expect(slow == 2)
        manual.advance(by: .seconds(5))
        #expect(reports.count == 1)
        #expect(manual.pendingCount == 0)

        struct Boom: Error {}
        #expect(throws: Boom.self) {
            try withWatchdog(timeout: .seconds(1), scheduler: manual, onTimeout: {}) { throw Boom() }
        }
        #expect(manual.pendingCount == 0)
    }

    @Test("withWatchdog async: the body runs to completion and the watchdog is invalidated after")
    func scopedAsync() async {
        let manual = ManualTimerScheduler()
        let reports = Counter()
        let value = await withWatchdog(timeout: .seconds(1), scheduler: manual, onTimeout: { reports.increment() }) {
            await Task.yield()
            manual.advance(by: .seconds(2))
            return "done"
        }
        #expect(value == "done")
        #expect(reports.count == 1)
        #expect(manual.pendingCount == 0)
    }
}

@Suite("withTimeout (virtual time)")
struct WithTimeoutTests {
    @Test("returns the operation's value when it wins, and cancels the deadline")
    func operationWins() async throws {
        let manual = ManualTimerScheduler()
        let value = try await withTimeout(.seconds(1), scheduler: manual) { 42 }
        #expect(value == 42)
        #expect(manual.pendingCount == 0)
    }

    @Test("at the deadline the operation is cancelled and awaited; its CancellationError becomes TimeoutError")
    func deadlineWins() async throws {
        let manual = ManualTimerScheduler()
        let sawCancellation = Counter()
        let finished = Counter()
        let task = Task {
            try await withTimeout(.seconds(1), scheduler: manual) {
                defer { finished.increment() }
                try await withTaskCancellationHandler {
                    try await Task.sleep(for: .seconds(3600))  // real time, but cancelled at once
                } onCancel: {
                    sawCancellation.increment()
                }
            }
        }
        while manual.pendingCount == 0 { await Task.yield() }
        manual.advance(by: .milliseconds(999))
        manual.advance(by: .milliseconds(1))
        do {
            try await task.value
            Issue.record("expected a TimeoutError")
        } catch let error as TimeoutError {
            #expect(error.timeout == .seconds(1))
            #expect("\(error)".contains("1.0 seconds"))
        }
        #expect(sawCancellation.count == 1)
        #expect(finished.count == 1, "withTimeout returned before its operation finished")
    }

    @Test("the operation's own error is rethrown")
    func operationThrows() async {
        struct Failure: Error {}
        let manual = ManualTimerScheduler()
        await #expect(throws: Failure.self) {
            try await withTimeout(.seconds(1), scheduler: manual) { throw Failure() }
        }
        #expect(manual.pendingCount == 0)
    }

    @Test("cancelling the caller cancels the operation")
    func callerCancelled() async {
        let manual = ManualTimerScheduler()
        let task = Task {
            try await withTimeout(.seconds(100), scheduler: manual) {
                try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, any Error>) in
                    continuation.resume()
                }
                while !Task.isCancelled { await Task.yield() }
                throw CancellationError()
            }
        }
        while manual.pendingCount == 0 { await Task.yield() }
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(manual.pendingCount == 0)
    }
}

@Suite("withTimeout (structured, fair)")
struct WithTimeoutContractTests {
    /// An operation that finishes only when `gate` opens, ignoring cancellation.
    final class Gate: Sendable {
        private let opened = Flag()
        func open() { opened.set() }
        func wait() async { while !opened.isSet { await Task.yield() } }
    }

    @Test("a value returned after the deadline is returned, and withTimeout waited for it")
    func lateValueWins() async throws {
        let manual = ManualTimerScheduler()
        let gate = Gate()
        let task = Task {
            try await withTimeout(.seconds(1), scheduler: manual) {
                await gate.wait(); return 5
            }
        }
        while manual.pendingCount == 0 { await Task.yield() }
        manual.advance(by: .seconds(2))
        gate.open()
        #expect(try await task.value == 5)
    }

    @Test("an error thrown after the deadline becomes TimeoutError; one thrown before is rethrown")
    func errorsBeforeAndAfter() async throws {
        struct Failure: Error {}
        let manual = ManualTimerScheduler()
        let gate = Gate()
        let late = Task {
            try await withTimeout(.seconds(1), scheduler: manual) { () async throws -> Int in
                await gate.wait()
                throw Failure()
            }
        }
        while manual.pendingCount == 0 { await Task.yield() }
        manual.advance(by: .seconds(1))
        gate.open()
        await #expect(throws: TimeoutError.self) { try await late.value }
        await #expect(throws: Failure.self) {
            try await withTimeout(.seconds(1), scheduler: manual) { () async throws -> Int in throw Failure() }
        }
    }

    @Test("withTimeout(.zero) { 1 } 10,000 times on the real scheduler: never a timeout")
    func zeroTimeoutFinishedOperationWins() async throws {
        var timeouts = 0
        for _ in 0..<10_000 {
            do { _ = try await withTimeout(.zero) { 1 } } catch is TimeoutError { timeouts += 1 }
        }
        #expect(timeouts == 0)
        #expect(SystemTimerScheduler.shared.pendingCount < 10, "deadlines are freed when the operation wins")
    }

    @Test("called on the main actor, the caller's isolation is kept")
    @MainActor
    func keepsIsolation() async throws {
        let value = try await withTimeout(.seconds(10)) { 3 }
        MainActor.assertIsolated()
        #expect(value == 3)
    }
}

/// Releasing a `Watchdog` is a barrier in every state, also after the handler
/// invalidated its own watchdog (which returns at once) and went on running.
@Suite("Watchdog release barrier (real time)")
struct WatchdogReleaseBarrierTests {
    final class WeakWatchdog: @unchecked Sendable {
        // Written once before the handler can run (under `ready`), read by the handler.
        weak var dog: Watchdog?
    }

    @Test("dropping the last reference while the handler runs waits for it, even after the handler invalidated it")
    func releaseWaitsAfterInnerInvalidate() {
        for _ in 0..<10 {
            let finished = Atomic<Bool>(false)
            let began = DispatchSemaphore(value: 0)
            let ready = DispatchSemaphore(value: 0)
            let box = WeakWatchdog()
            var dog: Watchdog? = Watchdog(timeout: .milliseconds(1)) {
                ready.wait()
                box.dog?.invalidate()  // from inside: returns at once
                began.signal()
                usleep(20_000)
                finished.store(true, ordering: .sequentiallyConsistent)
            }
            box.dog = dog
            ready.signal()
            #expect(began.wait(timeout: .now() + 30) == .success)
            dog = nil  // the last reference, while the handler still runs
            let handlerReturned = finished.load(ordering: .sequentiallyConsistent)
            #expect(handlerReturned, "the release returned before the handler did")
            _ = dog
        }
    }
}
