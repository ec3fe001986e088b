import AsyncAlgorithms
import SafeTimers
import SafeTimersTesting
import Synchronization
import Testing

/// A test-driven `AsyncSequence`: `next()` waits for the test to ``send(_:)`` an
/// element, and the test can wait until the consumer asks for the next one
/// (which means it has fully processed the previous one). No yielding, no
/// guessing: a handshake.
final class Feed<Element: Sendable>: AsyncSequence, Sendable {
    private struct State {
        var consumer: CheckedContinuation<Element?, Never>?
        var demandWaiter: CheckedContinuation<Void, Never>?
    }

    private let state = StateLock(State())

    struct AsyncIterator: AsyncIteratorProtocol {
        let feed: Feed
        mutating func next() async -> Element? { await feed.demand() }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(feed: self) }

    private func demand() async -> Element? {
        await withCheckedContinuation { continuation in
            let waiter = state.withLock { state in
                state.consumer = continuation
                defer { state.demandWaiter = nil }
                return state.demandWaiter
            }
            waiter?.resume()
        }
    }

    /// Waits until the consumer asks for an element.
    func waitForDemand() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state in
                if state.consumer != nil { return true }
                state.demandWaiter = continuation
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// Hands `element` (nil: the end) to the consumer once it asks.
    func send(_ element: Element?) async {
        await waitForDemand()
        let consumer = state.withLock { state in
            defer { state.consumer = nil }
            return state.consumer
        }
        consumer?.resume(returning: element)
    }
}

@Suite("TimerClock")
struct ClockTests {
    @Test("instants: arithmetic saturates, durations between instants, ordering")
    func instants() {
        let manual = ManualTimerScheduler()
        let start = manual.clock.now
        #expect(start.sinceCreation == .zero)
        let later = start.advanced(by: .seconds(2))
        #expect(later > start)
        #expect(start.duration(to: later) == .seconds(2))
        #expect(later - start == .seconds(2))
        #expect(later.duration(to: start) == .seconds(-2))
        #expect(start.advanced(by: .seconds(1e20)).sinceCreation == .nanoseconds(Int64.max))
        #expect(start.advanced(by: .seconds(-1e20)).sinceCreation == .nanoseconds(Int64.min))
        manual.advance(by: .seconds(5))
        #expect(manual.clock.now == start + .seconds(5))
        #expect(manual.clock.minimumResolution == .nanoseconds(1))
    }

    @Test("a sleeping task resumes exactly when the manual clock passes its deadline")
    func sleepOnManualClock() async throws {
        let manual = ManualTimerScheduler()
        let task = Task { () async throws -> Duration in
            try await manual.clock.sleep(for: .seconds(5))
            return manual.now
        }
        await manual.waitForSleepers(1)
        #expect(manual.pendingCount == 1)
        manual.advance(by: .milliseconds(4_999))
        #expect(manual.sleeperCount == 1)
        manual.advance(by: .milliseconds(1))
        #expect(try await task.value == .seconds(5))
        #expect(manual.pendingCount == 0)
    }

    @Test("Task.sleep(for:clock:) runs on the scheduler's clock")
    func taskSleep() async throws {
        let manual = ManualTimerScheduler()
        let task = Task { try await Task.sleep(for: .seconds(1), tolerance: .zero, clock: manual.clock) }
        await manual.waitForSleepers(1)
        manual.advance(by: .seconds(1))
        try await task.value
    }

    // The time limit only catches a hang: it counts wall time, and beside two busy
    // processes the suites' synchronous tests held both threads of the
    // cooperative pool for over a minute, so this test's tasks could not start
    // (it failed at the 1-minute limit and finished after 136 s).
    @Test(
        "a deadline already past returns at once; one equal to now waits for the next advance (as TestClock)",
        .timeLimit(.minutes(10)))
    func pastAndPresentDeadlines() async throws {
        let manual = ManualTimerScheduler()
        manual.advance(by: .seconds(10))
        // Past: no advance needed, nothing armed (the test would hang otherwise).
        try await manual.clock.sleep(for: .seconds(-1))
        try await manual.clock.sleep(until: manual.clock.now.advanced(by: .seconds(-5)))
        try await Task.sleep(for: .nanoseconds(-1), clock: manual.clock)
        #expect(manual.pendingCount == 0 && manual.sleeperCount == 0)
        // Past, in a cancelled task: the cancellation is reported.
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await manual.clock.sleep(for: .seconds(-1))
        }
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        // Now: suspends until an advance, even by zero.
        let present = Task { try await manual.clock.sleep(for: .zero) }
        await manual.waitForSleepers(1)
        #expect(manual.sleeperCount == 1)
        manual.advance(by: .zero)
        try await present.value
        #expect(manual.sleeperCount == 0 && manual.pendingCount == 0)
        // The system clock too: a past deadline returns without arming anything.
        let system = SystemTimerScheduler()
        try await system.clock.sleep(until: system.clock.now.advanced(by: .seconds(-3600)))
    }

    @Test("a cancelled sleep throws CancellationError and frees its entry at once")
    func cancelledSleep() async {
        let manual = ManualTimerScheduler()
        let task = Task { try await manual.clock.sleep(for: .seconds(3600)) }
        await manual.waitForSleepers(1)
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(manual.pendingCount == 0)
        #expect(manual.sleeperCount == 0)
        let already = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await manual.clock.sleep(for: .seconds(1))
        }
        await #expect(throws: CancellationError.self) { try await already.value }
        #expect(manual.pendingCount == 0)
    }

    @Test("the system clock sleeps for real (generous bound)")
    func systemClock() async throws {
        let clock = SystemTimerScheduler.shared.clock
        let start = clock.now
        try await clock.sleep(for: .milliseconds(20))
        #expect(start.duration(to: clock.now) >= .milliseconds(20))
    }

    @Test("a user-style sleep loop, 1,000 times: identical traces, no yielding")
    func sleepLoopIsDeterministic() async throws {
        var traces: Set<[Duration]> = []
        for _ in 0..<1_000 {
            let manual = ManualTimerScheduler()
            let clock = manual.clock
            let trace = StateLock<[Duration]>([])
            let task = Task {
                while !Task.isCancelled {
                    try await clock.sleep(for: .seconds(1))
                    trace.withLock { $0.append(manual.now) }
                }
            }
            // A resumed task runs concurrently with the rest of the advance that
            // resumed it, so it reads `now` as the deadline only if the advance
            // ends there: advance by exactly one sleep each time.
            for _ in 0..<5 {
                await manual.waitForSleepers(1)
                manual.advance(by: .seconds(1))
            }
            await manual.waitForSleepers(1)
            task.cancel()
            _ = try? await task.value
            traces.insert(trace.withLock { $0 })
        }
        #expect(traces.count == 1, "\(traces)")
        #expect(traces.first == [.seconds(1), .seconds(2), .seconds(3), .seconds(4), .seconds(5)])
    }

    @Test("async-algorithms' debounce driven on the manual clock, 1,000 times: identical traces")
    func debounceIsDeterministic() async {
        var traces: Set<[String]> = []
        for _ in 0..<1_000 {
            let manual = ManualTimerScheduler()
            let feed = Feed<Int>()
            let output = StateLock<[String]>([])
            let (emitted, emit) = AsyncStream.makeStream(of: Void.self)
            var emissions = emitted.makeAsyncIterator()
            let consumer = Task {
                for await value in feed.debounce(for: .seconds(1), clock: manual.clock) {
                    output.withLock { $0.append("\(value)@\(manual.now)") }
                    emit.yield()
                }
            }
            await feed.send(1)
            await feed.waitForDemand()  // 1 is in the debouncer
            await manual.waitForSleepers(1)
            manual.advance(by: .milliseconds(500))
            await feed.send(2)
            await feed.waitForDemand()  // 2 replaced 1; its quiet period ends at 1.5 s
            manual.advance(by: .milliseconds(600))  // 1.1 s: the first sleep ends, 2 is 0.4 s short
            await manual.waitForSleepers(1)
            manual.advance(by: .milliseconds(400))  // 1.5 s: 2 comes out
            await emissions.next()
            await feed.send(3)
            await feed.waitForDemand()
            await manual.waitForSleepers(1)
            manual.advance(by: .seconds(1))
            await emissions.next()
            await feed.send(nil)
            await consumer.value
            traces.insert(output.withLock { $0 })
        }
        #expect(traces.count == 1, "\(traces)")
        #expect(traces.first == ["2@1.5 seconds", "3@2.5 seconds"])
    }

    @Test("deadlines as instants: schedule(at:), reschedule(at:), withTimeout(until:), start(after:)")
    func deadlines() async throws {
        let manual = ManualTimerScheduler()
        let ran = StateLock<[Duration]>([])
        let deadline = manual.clock.now.advanced(by: .seconds(2))
        let work = DelayedWork.schedule(at: deadline, scheduler: manual) { ran.withLock { $0.append(manual.now) } }
        let moved = DelayedWork.schedule(at: deadline, scheduler: manual) { ran.withLock { $0.append(manual.now) } }
        #expect(moved.reschedule(at: deadline.advanced(by: .seconds(1))))
        let timer = RepeatingTimer(interval: .seconds(10), repetitions: 2, scheduler: manual) {
            ran.withLock { $0.append(manual.now) }
        }
        timer.start(after: .milliseconds(500))
        manual.advance(by: .seconds(11))
        #expect(ran.withLock { $0 } == [.milliseconds(500), .seconds(2), .seconds(3), .milliseconds(10_500)])
        #expect(work.state == .completed)
        #expect(!moved.reschedule(after: .seconds(1)), "completed work cannot be rescheduled")
        let value = try await withTimeout(until: manual.clock.now.advanced(by: .seconds(1)), scheduler: manual) { 9 }
        #expect(value == 9)
    }

    @Test("work that re-arms itself with a zero delay cannot make an advance loop forever")
    func zeroDelayRearmTerminates() {
        let manual = ManualTimerScheduler()
        let runs = StateLock(0)
        let keep = StateLock<[DelayedWork]>([])
        @Sendable func again() {
            runs.withLock { $0 += 1 }
            let next = DelayedWork.schedule(after: .zero, scheduler: manual) { again() }
            keep.withLock { $0 = [next] }
        }
        keep.withLock { $0 = [DelayedWork.schedule(after: .zero, scheduler: manual) { again() }] }
        manual.advance(by: .zero)
        #expect(runs.withLock { $0 } == 1, "once per instant")
        manual.advance(by: .seconds(1))
        #expect(runs.withLock { $0 } == 2, "the deferred one runs at the next instant or advance")
        #expect(manual.runUntilIdle(limit: 50) == 50, "runUntilIdle returns at its limit")
        keep.withLock { $0.forEach { $0.cancel() } }
    }
}
