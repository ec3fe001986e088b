import Dispatch
import Foundation
import Synchronization
import Testing

@testable import SafeTimers

/// Where a watchdog reports when it is given no queue: not behind blocked
/// global-queue work. On Linux the global queue adds a thread about once a
/// second while its threads are blocked, so a report queued there behind a
/// dozen blocked blocks would wait for seconds.
@Suite("A watchdog with no queue reports beside a blocked global queue (real time)", .serialized)
struct WatchdogReportQueueTests {
    /// How a watchdog is made in one case.
    enum Form: String, CaseIterable, Sendable {
        /// `withWatchdog` on the thread's slot (the fast path).
        case section
        /// `withWatchdog` nested inside another: the inner one is a `Watchdog`.
        case nestedSection
        /// A `Watchdog` made and invalidated by hand.
        case watchdog
        /// A `Watchdog` kicked once before it overruns.
        case kicked
        /// Two `Watchdog`s due together (one scheduler round, one batch): the
        /// first one's report waits for the second's, which must not queue behind it.
        case dueTogether
    }

    @Test(
        "the report comes before a block queued on the global queue at the same time runs",
        arguments: Form.allCases)
    func reportBesideBlockedGlobalQueue(form: Form) async {
        let outcome = await onOwnThread { () -> (reported: Bool, globalHadRun: Bool, blockers: Int, millis: Int) in
            // Released here, not by the test's task: Swift concurrency's pool may
            // be waiting for the same global queue.
            let release = DispatchSemaphore(value: 0)
            let blockers = saturateGlobalQueue(until: release)
            defer { for _ in 0..<blockers { release.signal() } }
            let globalRan = Atomic<Bool>(false)
            let reported = DispatchSemaphore(value: 0)
            let start = ContinuousClock.now
            DispatchQueue.global().async { globalRan.store(true, ordering: .sequentiallyConsistent) }
            let came = guarded(form, timeout: .milliseconds(10), onTimeout: { reported.signal() }) {
                reported.wait(timeout: .now() + 60) == .success
            }
            let millis = Int((ContinuousClock.now - start) / .milliseconds(1))
            return (came, globalRan.load(ordering: .sequentiallyConsistent), blockers, millis)
        }
        print("WATCHDOGREPORT \(form) after \(outcome.millis) ms, \(outcome.blockers) blocked blocks")
        #expect(outcome.reported, "\(form): no report in 60 s")
        #expect(
            !outcome.globalHadRun,
            "\(form): the report (\(outcome.millis) ms) waited for the global queue (\(outcome.blockers) blocked)")
    }

    /// Queues blocks that wait for `release` on the global queue until one of
    /// them has waited 200 ms for a thread, then two more: anything queued
    /// after them waits for the queue to add threads (about one a second).
    /// Returns how many it queued.
    private func saturateGlobalQueue(until release: DispatchSemaphore) -> Int {
        let started = Atomic<Int>(0)
        var queued = 0
        while queued < 1_000 {
            queued += 1
            DispatchQueue.global().async {
                started.add(1, ordering: .sequentiallyConsistent)
                release.wait()
            }
            let waitUntil = ContinuousClock.now + .milliseconds(200)
            while started.load(ordering: .sequentiallyConsistent) < queued && ContinuousClock.now < waitUntil {
                usleep(1_000)
            }
            if started.load(ordering: .sequentiallyConsistent) < queued { break }
        }
        for _ in 0..<2 { DispatchQueue.global().async { release.wait() } }
        return queued + 2
    }

    /// Runs `body` under a watchdog made as `form` says, with no queue.
    private func guarded(
        _ form: Form, timeout: Duration, onTimeout: @escaping @Sendable () -> Void, _ body: () -> Bool
    ) -> Bool {
        switch form {
        case .section:
            return withWatchdog(timeout: timeout, onTimeout: onTimeout, body)
        case .nestedSection:
            return withWatchdog(timeout: .seconds(3600), onTimeout: {}) {
                withWatchdog(timeout: timeout, onTimeout: onTimeout, body)
            }
        case .watchdog, .kicked:
            let watchdog = Watchdog(timeout: timeout, onTimeout: onTimeout)
            defer { watchdog.invalidate() }
            if form == .kicked { watchdog.kick() }
            return body()
        case .dueTogether:
            let secondCame = DispatchSemaphore(value: 0)
            let first = Watchdog(timeout: timeout) {
                if secondCame.wait(timeout: .now() + 60) == .success { onTimeout() }
            }
            let second = Watchdog(timeout: timeout) { secondCame.signal() }
            defer {
                first.invalidate()
                second.invalidate()
            }
            return body()
        }
    }

    /// Runs `body` on a new thread (never the test's cooperative pool).
    private func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
            Thread { continuation.resume(returning: body()) }.start()
        }
    }
}
