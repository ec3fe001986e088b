import Dispatch
import Foundation
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// The lock-free fast path of the synchronous `withWatchdog` on the shared
/// scheduler (`WatchdogSlot`). Real time, on threads of their own (never the
/// test's cooperative pool), with generous bounds: these check correctness, not
/// speed.
@Suite("withWatchdog fast path (real time)")
struct WatchdogSlotTests {
    /// Runs `body` on a new thread and returns once it has returned.
    private func onOwnThread(_ body: @escaping @Sendable () -> Void) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let thread = Thread {
                body()
                continuation.resume()
            }
            thread.start()
        }
    }

    @Test("an overrunning section is reported while it runs, on the queue given")
    func overrunIsReported() async {
        let reported = DispatchSemaphore(value: 0)
        let onQueue = Cell<Bool>(false)
        let queue = DispatchQueue(label: "slot.report")
        let key = DispatchSpecificKey<Bool>()
        queue.setSpecific(key: key, value: true)
        let sawReport = Cell<Bool>(false)
        await onOwnThread {
            withWatchdog(
                timeout: .milliseconds(20), queue: queue,
                onTimeout: {
                    onQueue.set(DispatchQueue.getSpecific(key: key) == true)
                    reported.signal()
                }
            ) {
                // The body waits for its own report: it is reported while it runs.
                sawReport.set(reported.wait(timeout: .now() + 10) == .success)
            }
        }
        #expect(sawReport.value)
        #expect(onQueue.value)
    }

    @Test("a section that ends in time is never reported, and the handler's captures go when it ends")
    func inTimeIsSilent() async {
        let reports = Counter()
        let probe = Cell<Bool>(false)
        await onOwnThread {
            final class Captured: Sendable {
                let flag: UnsafeSendableFlag
                init(_ flag: UnsafeSendableFlag) { self.flag = flag }
                deinit { flag.set() }
            }
            let flag = UnsafeSendableFlag()
            do {
                let captured = Captured(flag)
                for _ in 0..<1_000 {
                    withWatchdog(
                        timeout: .seconds(30),
                        onTimeout: {
                            _ = captured; reports.increment()
                        }
                    ) {}
                }
            }
            probe.set(flag.isSet)
        }
        #expect(probe.value, "the last section's handler was still held after it ended")
        #expect(reports.count == 0)
    }

    @Test("the engine entry is armed lazily: back-to-back sections arm it once")
    func armsLazily() async {
        let armings = Cell<Int>(-1)
        await onOwnThread {
            for _ in 0..<10_000 {
                withWatchdog(timeout: .seconds(30), onTimeout: {}) {}
            }
            let slot = WatchdogSlot.current(for: SystemTimerScheduler.shared)!.takeUnretainedValue()
            armings.set(slot.armingCount)
        }
        #expect(armings.value == 1)
    }

    @Test("a shorter timeout than the armed one re-arms earlier and still reports")
    func shorterTimeoutReArms() async {
        let reported = DispatchSemaphore(value: 0)
        let saw = Cell<Bool>(false)
        await onOwnThread {
            withWatchdog(timeout: .seconds(3600), onTimeout: {}) {}
            withWatchdog(timeout: .milliseconds(10), onTimeout: { reported.signal() }) {
                saw.set(reported.wait(timeout: .now() + 10) == .success)
            }
        }
        #expect(saw.value)
    }

    @Test("a handler running when the section ends is waited for: withWatchdog returns after it")
    func leaveWaitsForRunningHandler() async {
        let started = DispatchSemaphore(value: 0)
        let finished = Cell<Bool>(false)
        let sawFinished = Cell<Bool>(false)
        await onOwnThread {
            withWatchdog(
                timeout: .milliseconds(5),
                onTimeout: {
                    started.signal()
                    usleep(100_000)
                    finished.set(true)
                }
            ) {
                _ = started.wait(timeout: .now() + 10)
            }
            sawFinished.set(finished.value)
        }
        #expect(sawFinished.value)
    }

    @Test("nested sections: the inner one takes the ordinary path and both report")
    func nestedSections() async {
        let outer = DispatchSemaphore(value: 0)
        let inner = DispatchSemaphore(value: 0)
        let both = Cell<Bool>(false)
        await onOwnThread {
            withWatchdog(timeout: .milliseconds(10), onTimeout: { outer.signal() }) {
                withWatchdog(timeout: .milliseconds(10), onTimeout: { inner.signal() }) {
                    let a = inner.wait(timeout: .now() + 10) == .success
                    let b = outer.wait(timeout: .now() + 10) == .success
                    both.set(a && b)
                }
            }
        }
        #expect(both.value)
    }

    /// The race the lazy arming must survive: sections that end in time (the
    /// engine entry expires with nothing to do and is not re-armed) interleaved
    /// with sections that overrun, on several threads. Every overrun must be
    /// reported while its section still runs, and no handler may begin after its
    /// section returned.
    @Test(
        "under racing sections every overrun is reported and no report comes after its section",
        arguments: [false, true])
    func racingSections(uniformTimeout: Bool) async {
        let threads = 3
        let rounds = 60
        let missed = Cell<Int>(0)
        let late = Cell<Int>(0)
        let reported = Cell<Int>(0)
        await withTaskGroup(of: Void.self) { group in
            for thread in 0..<threads {
                group.addTask {
                    await onOwnThread {
                        for round in 0..<rounds {
                            let inSection = Cell<Bool>(true)
                            let report = DispatchSemaphore(value: 0)
                            let overrun = (round + thread) % 3 == 0
                            // Uniform: an overrunning section's deadline is later than the
                            // armed one, so only the lazy re-arm can catch it.
                            let timeout: Duration = .milliseconds(uniformTimeout ? 8 : overrun ? 2 : 30)
                            withWatchdog(
                                timeout: timeout,
                                onTimeout: {
                                    if !inSection.value { late.add(1) }
                                    reported.add(1)
                                    report.signal()
                                }
                            ) {
                                if overrun {
                                    if report.wait(timeout: .now() + 5) != .success { missed.add(1) }
                                } else {
                                    usleep(UInt32((round * 7 + thread * 3) % 4) * 1_000)
                                }
                            }
                            // Set once the section has returned: a handler that began
                            // just before the body's end is waited for by the return,
                            // and is not late.
                            inSection.set(false)
                        }
                    }
                }
            }
        }
        // Anything delivered but not yet begun was revoked; give stragglers time to show.
        try? await Task.sleep(for: .milliseconds(100))
        #expect(missed.value == 0)
        #expect(late.value == 0)
        #expect(reported.value >= threads * rounds / 3)
    }

    @Test(
        "a deadline never fires early, on the coarse clock (1 s) or the precise one (20 ms)",
        arguments: [1_000_000_000, 20_000_000] as [Int64])
    func neverEarly(timeout: Int64) async {
        let earliest = Cell<Int64>(Int64.max)
        await onOwnThread {
            for _ in 0..<3 {
                let reported = DispatchSemaphore(value: 0)
                let start = MonotonicClock.nanoseconds()
                withWatchdog(
                    timeout: .nanoseconds(timeout),
                    onTimeout: {
                        let elapsed = MonotonicClock.nanoseconds() - start
                        if elapsed < earliest.value { earliest.set(elapsed) }
                        reported.signal()
                    }
                ) {
                    _ = reported.wait(timeout: .now() + 10)
                }
            }
        }
        #expect(earliest.value >= timeout)
    }
}

/// A value shared between the test, its threads and handlers.
final class Cell<Value: Sendable>: Sendable {
    fileprivate let lock: StateLock<Value>
    init(_ value: Value) { lock = StateLock(value) }
    func set(_ value: Value) { lock.withLock { $0 = value } }
    var value: Value { lock.withLock { $0 } }
}

extension Cell where Value == Int {
    func add(_ amount: Int) { lock.withLock { $0 += amount } }
}

/// A flag set from a deinit.
final class UnsafeSendableFlag: Sendable {
    private let value = Cell<Bool>(false)
    func set() { value.set(true) }
    var isSet: Bool { value.value }
}
