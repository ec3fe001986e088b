import Dispatch
import Foundation
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// Batched delivery: firings due together for one destination reach it in one
/// hop per 16 handlers, in deadline order; on a destination that may run blocks
/// concurrently, a helper block is on its way whenever a handler begins while
/// others of its hop wait, so a blocking handler holds up nobody and waiting
/// for a handler of one's own hop is no deadlock. Real time, generous bounds, a
/// private scheduler each (so that the hop count is this test's alone); run
/// under ThreadSanitizer too.
@Suite("Batched delivery (real time)")
struct BatchedDeliveryTests {
    /// What ran, in order.
    private final class Ran: Sendable {
        private let order = StateLock<[Int]>([])
        func record(_ index: Int) { order.withLock { $0.append(index) } }
        var all: [Int] { order.withLock { $0 } }
    }

    /// How often each named thing ended.
    private final class Counts: Sendable {
        private let counts = StateLock<[String: Int]>([:])
        func add(_ name: String) { counts.withLock { $0[name, default: 0] += 1 } }
        var all: [String: Int] { counts.withLock { $0 } }
    }

    private final class Flag: Sendable {
        let value = Atomic<Bool>(false)
    }

    @Test("200 works due together on a serial queue: all run, in arming order, in at most 13 hops")
    func serialQueue() async {
        let scheduler = SystemTimerScheduler()
        let queue = DispatchQueue(label: "batched.serial")
        let ran = Ran()
        let deadline = scheduler.clock.now.advanced(by: .milliseconds(300))
        let works = (0..<200).map { index in
            DelayedWork.schedule(at: deadline, on: queue, scheduler: scheduler) { ran.record(index) }
        }
        let settled = await eventually(within: 60) { ran.all.count == 200 }
        #expect(settled)
        #expect(ran.all == Array(0..<200))
        // 200 / 16 = 12.5: 13 hops when one round fires them all (a round split
        // by a wake-up in the middle of the arming could add one more).
        #expect(scheduler.engine.deliveryBatch.carriedCount == 200)
        #expect(scheduler.engine.deliveryBatch.hopCount <= 14)
        withExtendedLifetime(works) {}
    }

    @Test(
        "works due together on the main queue, reached through different DispatchQueue.main values, run in deadline order"
    )
    func mainQueueReachedTwice() async {
        let scheduler = SystemTimerScheduler()
        let storedMain = DispatchQueue.main
        for _ in 0..<10 {
            let ran = Ran()
            let at = scheduler.clock.now.advanced(by: .milliseconds(5))
            // On Linux each `DispatchQueue.main` is a wrapper object of its own.
            let works = [
                DelayedWork.schedule(at: at, on: storedMain, scheduler: scheduler) { ran.record(1) },
                DelayedWork.schedule(at: at.advanced(by: .microseconds(1)), on: .main, scheduler: scheduler) {
                    ran.record(2)
                },
                DelayedWork.schedule(at: at.advanced(by: .microseconds(2)), on: storedMain, scheduler: scheduler) {
                    ran.record(3)
                },
            ]
            #expect(await eventually(within: 60) { ran.all.count == 3 })
            #expect(ran.all == [1, 2, 3])
            withExtendedLifetime(works) {}
        }
    }

    @Test("a handler blocking on the global queue does not hold up the others, not even those of its own hop")
    func blockingHandler() async {
        let scheduler = SystemTimerScheduler()
        let ran = Ran()
        let othersDone = DispatchSemaphore(value: 0)
        let released = Flag()
        let deadline = scheduler.clock.now.advanced(by: .milliseconds(300))
        let count = 48
        let works = (0..<count).map { index in
            DelayedWork.schedule(at: deadline, scheduler: scheduler) {
                if index == 0 {
                    // Block until every other work has run (the 15 of its own hop
                    // included: a helper block takes them over).
                    released.value.store(othersDone.wait(timeout: .now() + 60) == .success, ordering: .relaxed)
                }
                ran.record(index)
                if index != 0 && ran.all.filter({ $0 != 0 }).count == count - 1 { othersDone.signal() }
            }
        }
        let settled = await eventually(within: 60) { ran.all.count == count }
        #expect(settled)
        let wasReleased = released.value.load(ordering: .relaxed)
        #expect(wasReleased, "the blocked handler held up handlers of its hop until it returned")
        #expect(scheduler.engine.deliveryBatch.helperCount >= 1)
        withExtendedLifetime(works) {}
    }

    @Test("a handler that waits for a later handler of its own hop is not a deadlock")
    func waitsForSameHop() async {
        let scheduler = SystemTimerScheduler()
        let signalled = DispatchSemaphore(value: 0)
        let waited = Flag()
        let deadline = scheduler.clock.now.advanced(by: .milliseconds(200))
        let first = DelayedWork.schedule(at: deadline, scheduler: scheduler) {
            waited.value.store(signalled.wait(timeout: .now() + 60) == .success, ordering: .relaxed)
        }
        let second = DelayedWork.schedule(at: deadline, scheduler: scheduler) { signalled.signal() }
        let settled = await eventually(within: 60) { first.state == .completed && second.state == .completed }
        #expect(settled)
        let didWait = waited.value.load(ordering: .relaxed)
        #expect(didWait)
        #expect(scheduler.engine.deliveryBatch.carriedCount == 2)
        #expect(scheduler.engine.deliveryBatch.hopCount == 1)
    }

    @Test("a work cancelled after its round collected it never runs; cancel says it prevented the run")
    func cancelAfterCollection() async {
        // Block the serial queue so that collected handlers wait in it, then
        // cancel half of them: those never run.
        let scheduler = SystemTimerScheduler()
        let queue = DispatchQueue(label: "batched.cancel")
        let gate = DispatchSemaphore(value: 0)
        // No timeout: on a loaded machine (ThreadSanitizer, every suite at once)
        // this task can wait minutes for a cooperative thread, and a gate that
        // opened by itself would let the handlers run before the cancels.
        queue.async { gate.wait() }
        defer { gate.signal() }  // released below or here, whatever happens
        let ran = Ran()
        let deadline = scheduler.clock.now.advanced(by: .milliseconds(100))
        let works = (0..<40).map { index in
            DelayedWork.schedule(at: deadline, on: queue, scheduler: scheduler) { ran.record(index) }
        }
        let collected = await eventually(within: 60) { scheduler.engine.deliveryBatch.hopCount >= 3 }
        #expect(collected)
        var prevented = 0
        for index in stride(from: 1, to: 40, by: 2) where works[index].cancel() { prevented += 1 }
        #expect(prevented == 20)
        gate.signal()
        let settled = await eventually(within: 60) { ran.all.count == 20 }
        #expect(settled)
        try? await Task.sleep(for: .milliseconds(50))
        #expect(ran.all == Array(stride(from: 0, to: 40, by: 2)))
    }

    @Test("30 main-actor works due together all run on the main actor, in order")
    @MainActor
    func mainActor() async {
        let scheduler = SystemTimerScheduler()
        let ran = Ran()
        let deadline = scheduler.clock.now.advanced(by: .milliseconds(200))
        let works = (0..<30).map { index in
            DelayedWork.schedule(at: deadline, scheduler: scheduler) { @MainActor in
                MainActor.assertIsolated()
                ran.record(index)
            }
        }
        let settled = await eventually(within: 60) { ran.all.count == 30 }
        #expect(settled)
        #expect(ran.all == Array(0..<30))
        withExtendedLifetime(works) {}
    }

    @Test("24 repeating timers due together: every tick stream gets 1…5 in order, no handler overlaps itself")
    func tickStreamsInBursts() async {
        let scheduler = SystemTimerScheduler()
        let overlaps = Flag()
        let running = StateLock<Set<Int>>([])
        let timers = (0..<24).map { index in
            RepeatingTimer(interval: .milliseconds(20), repetitions: 5, scheduler: scheduler) {
                let entered = running.withLock { $0.insert(index).inserted }
                if !entered { overlaps.value.store(true, ordering: .relaxed) }
                usleep(200)  // long enough for a helper block to start beside the hop
                running.withLock { _ = $0.remove(index) }
            }
        }
        let streams = timers.map(\.ticks)
        for timer in timers { timer.start() }
        let numbers = await withTaskGroup(of: [Int].self) { group in
            for stream in streams {
                group.addTask {
                    var seen: [Int] = []
                    for await tick in stream { seen.append(tick.number) }
                    return seen
                }
            }
            var all: [[Int]] = []
            for await seen in group { all.append(seen) }
            return all
        }
        #expect(numbers.count == 24)
        #expect(numbers.allSatisfy { $0 == [1, 2, 3, 4, 5] }, "\(numbers)")
        let overlapped = overlaps.value.load(ordering: .relaxed)
        #expect(!overlapped)
        #expect(timers.allSatisfy { $0.state == .finished })
    }

    @Test("clock sleeps, withWatchdog overruns and DelayedWorks due in one burst all end, each once")
    func mixedBurst() async {
        let scheduler = SystemTimerScheduler()
        let fired = Counts()
        let deadline = scheduler.clock.now.advanced(by: .milliseconds(150))
        let works = (0..<20).map { index in
            DelayedWork.schedule(at: deadline, scheduler: scheduler) { fired.add("work \(index)") }
        }
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<20 {
                group.addTask {
                    try? await scheduler.clock.sleep(until: deadline)
                    fired.add("sleep \(index)")
                }
            }
            for index in 0..<4 {
                group.addTask {
                    // A section that overruns its 100 ms on threads of their own.
                    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                        Thread {
                            _ = withWatchdog(
                                timeout: .milliseconds(100), scheduler: scheduler,
                                onTimeout: { fired.add("watchdog \(index)") }
                            ) { usleep(250_000) }
                            done.resume()
                        }.start()
                    }
                }
            }
        }
        let settled = await eventually(within: 60) { fired.all.count == 44 }
        #expect(settled)
        try? await Task.sleep(for: .milliseconds(50))
        let counts = fired.all
        #expect(counts.count == 44 && counts.values.allSatisfy { $0 == 1 }, "\(counts)")
        withExtendedLifetime(works) {}
    }

    @Test(
        "after works due together on a serial queue have all run, nothing is pending: a hop arms no engine entry"
    )
    func nothingPendingAfterABatch() async {
        let scheduler = SystemTimerScheduler()
        let queue = DispatchQueue(label: "batched.serial")
        let ran = Ran()
        for attempt in 0..<5 {
            let deadline = scheduler.clock.now.advanced(by: .milliseconds(20))
            let works = (0..<3).map { index in
                DelayedWork.schedule(at: deadline, on: queue, scheduler: scheduler) {
                    if index == 0 { usleep(20_000) }  // the rest wait in the hop: a helper is sent
                    ran.record(attempt * 3 + index)
                }
            }
            let settled = await eventually(within: 60) { ran.all.count == attempt * 3 + 3 }
            #expect(settled)
            // Read at once and for the next 150 ms.
            var seen: [Int] = []
            for _ in 0..<30 {
                seen.append(scheduler.pendingCount)
                try? await Task.sleep(for: .milliseconds(5))
            }
            #expect(seen.allSatisfy { $0 == 0 }, "pendingCount after every work ran: \(seen)")
            withExtendedLifetime(works) {}
        }
    }
}
