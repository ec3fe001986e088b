import Dispatch
import Foundation
import SafeTimersTesting
import Testing

@testable import SafeTimers

/// A request handler's state: not `Sendable`, like a server framework's context.
private final class RequestState {
    var steps: [String] = []
}

/// A middleware shaped like a server framework's: `next` is non-escaping and not
/// `@Sendable`, and captures non-`Sendable` state. It is `nonisolated(nonsending)`,
/// as the operation is: a plain nonisolated async `next` (which runs on the global
/// executor) could not be handed the caller's non-`Sendable` state from it.
private func guarded(
    timeout: Duration, scheduler: any TimerScheduler, state: RequestState,
    next: nonisolated(nonsending) (RequestState) async throws -> String
) async throws -> String {
    try await withTimeout(timeout, scheduler: scheduler) {
        state.steps.append("before")
        let result = try await next(state)
        state.steps.append("after")
        return result
    }
}

/// An actor whose method limits work on its own state.
private actor Inventory {
    var count = 0

    func refill(scheduler: any TimerScheduler) async throws -> Int {
        try await withTimeout(.seconds(1), scheduler: scheduler) {
            assertIsolated("the operation left the actor")
            count += 1  // actor state, touched synchronously: the closure is isolated to self
            await Task.yield()
            assertIsolated("the operation left the actor after a suspension")
            count += 1
            return count
        }
    }
}

/// `withTimeout` around non-escaping, non-`Sendable` work (a middleware's
/// `next`): the same outcome rules, the caller never cancelled, structured.
@Suite("withTimeout around non-escaping work")
struct NonEscapingTimeoutTests {
    @Test("a middleware's non-escaping next runs under withTimeout; its state is the caller's after")
    func middlewareNext() async throws {
        let manual = ManualTimerScheduler()
        let state = RequestState()
        let value = try await guarded(timeout: .seconds(1), scheduler: manual, state: state) { state in
            state.steps.append("next")
            return "ok"
        }
        #expect(value == "ok")
        #expect(state.steps == ["before", "next", "after"])
        #expect(manual.pendingCount == 0)
    }

    @Test("at the deadline only the operation is cancelled: the caller goes on, not cancelled")
    func deadlineCancelsOnlyTheOperation() async throws {
        let manual = ManualTimerScheduler()
        let task = Task { () -> (String, Bool, [String]) in
            let state = RequestState()
            do {
                _ = try await guarded(timeout: .seconds(1), scheduler: manual, state: state) { _ in
                    try await manual.clock.sleep(for: .seconds(3600))
                    return "late"
                }
                return ("no timeout", Task.isCancelled, state.steps)
            } catch is TimeoutError {
                return ("timeout", Task.isCancelled, state.steps)
            }
        }
        await manual.waitForSleepers(1)
        manual.advance(by: .seconds(1))
        let (outcome, callerCancelled, steps) = try await task.value
        #expect(outcome == "timeout")
        #expect(!callerCancelled)
        #expect(steps == ["before"])
    }

    @Test("an actor's operation runs on the actor, before and after it suspends")
    func actorIsolatedOperation() async throws {
        let manual = ManualTimerScheduler()
        let inventory = Inventory()
        #expect(try await inventory.refill(scheduler: manual) == 2)
        #expect(try await inventory.refill(scheduler: manual) == 4)
    }

    @Test("the deadline is kept while every thread of the cooperative pool is busy")
    func deadlineWithBusyPool() async throws {
        struct Boom: Error {}
        let release = Counter()
        // Keep every thread of the pool but one busy: the operation needs that one
        // (it would not start at all with none), and then holds it.
        let width = ProcessInfo.processInfo.activeProcessorCount
        let hogs = (0..<max(1, width - 1)).map { _ in
            Task.detached {
                while release.count == 0 { _ = (0..<1_000).reduce(0, &+) }
            }
        }
        defer { release.increment() }
        let sawCancellation = Counter()
        do {
            _ = try await withTimeout(.milliseconds(10)) { () throws -> Int in
                // Busy, never suspending, until cancelled (at most 10 s).
                let began = ContinuousClock.now
                while !Task.isCancelled && ContinuousClock.now - began < .seconds(10) {}
                if Task.isCancelled { sawCancellation.increment() }
                throw Boom()
            }
            Issue.record("expected an error")
        } catch is TimeoutError {
        } catch {
            Issue.record("the operation's own error came back: the deadline was decided late (\(error))")
        }
        #expect(sawCancellation.count == 1)
        release.increment()
        for hog in hogs { await hog.value }
    }

    @Test(
        "real time: non-Sendable state handed to the operation and read after, racing a short deadline (ThreadSanitizer)"
    )
    func racingTheDeadline() async throws {
        var values = 0
        var timeouts = 0
        for round in 0..<1_000 {
            let state = RequestState()
            do {
                let value = try await withTimeout(.microseconds(round % 40)) {
                    state.steps.append("ran")
                    if round % 2 == 0 { try await Task.sleep(for: .microseconds(20)) }
                    return round
                }
                #expect(value == round)
                values += 1
            } catch is TimeoutError {
                timeouts += 1
            }
            #expect(state.steps == ["ran"])
        }
        #expect(values + timeouts == 1_000)
        #expect(values >= 500, "an operation that returns without suspending always wins")
    }
}
