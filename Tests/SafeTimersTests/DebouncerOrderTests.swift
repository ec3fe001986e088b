import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// A debouncer's runs under bursts, flushes, cancels and re-entrant actions, in virtual and real time.
@Suite("Debouncer: the latest call wins, flushed actions run, leading calls keep call order")
struct DebouncerOrderTests {
    @Test("With leading: true, a call after a flush with nothing pending runs at once")
    func leadingAfterEmptyFlush() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let debouncer = Debouncer(delay: .seconds(10), leading: true, scheduler: manual)
        debouncer.call { log.add("a") }
        manual.advance(by: .zero)
        #expect(log.all == ["a"])
        debouncer.flush()
        debouncer.call { log.add("b") }
        manual.advance(by: .zero)
        #expect(log.all == ["a", "b"])
        debouncer.flush()
        manual.advance(by: .zero)
        // b was the leading call of a burst with no later call: nothing more runs.
        #expect(log.all == ["a", "b"])
        manual.advance(by: .seconds(20))
        #expect(log.all == ["a", "b"])
        #expect(manual.pendingCount == 0)
    }

    @Test("A debouncer's last run is its latest call, its actions never overlap, and cancel is a barrier (real time)")
    func debouncerLatestCallWinsInRealTime() {
        var problems: [String] = []
        for round in 0..<40 {
            let debouncer = Debouncer(delay: .microseconds(200), leading: round % 2 == 0, queue: .global())
            let running = Atomic<Int>(0)
            let overlap = Atomic<Bool>(false)
            let last = Atomic<Int>(-1)
            let calls = 300
            for index in 0..<calls {
                debouncer.call {
                    if running.add(1, ordering: .relaxed).newValue > 1 { overlap.store(true, ordering: .relaxed) }
                    usleep(150)
                    last.store(index, ordering: .relaxed)
                    running.subtract(1, ordering: .relaxed)
                }
                if index % 7 == 0 { usleep(250) }
            }
            // Wait until the latest call ran (or 10 s).
            let start = DispatchTime.now()
            while last.load(ordering: .relaxed) != calls - 1,
                DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds < 10_000_000_000
            {
                usleep(100)
            }
            debouncer.cancel()
            let after = last.load(ordering: .relaxed)
            usleep(2_000)
            if after != calls - 1 { problems.append("round \(round): last run was \(after)") }
            if last.load(ordering: .relaxed) != after { problems.append("round \(round): ran after cancel") }
            if overlap.load(ordering: .relaxed) { problems.append("round \(round): overlap") }
        }
        #expect(problems == [])
    }

    @Test("A flushed action always runs, even while another action runs and newer calls come (real time)")
    func flushedActionAlwaysRuns() {
        var problems: [String] = []
        for round in 0..<40 {
            let debouncer = Debouncer(delay: .seconds(3600), leading: round % 2 == 0, queue: .global())
            let ranFlushed = DispatchSemaphore(value: 0)
            let started = DispatchSemaphore(value: 0)
            debouncer.call {
                started.signal()
                usleep(2_000)
            }
            debouncer.flush()
            started.wait()
            debouncer.call { ranFlushed.signal() }
            debouncer.flush()
            if ranFlushed.wait(timeout: .now() + 10) == .timedOut {
                problems.append("round \(round): flushed action lost")
            }
            debouncer.cancel()
        }
        #expect(problems == [])
    }

    @Test("A flushed debouncer action runs even when a newer call comes before it begins (virtual time)")
    func flushThenCallInVirtualTime() {
        for leading in [false, true] {
            let manual = ManualTimerScheduler()
            let log = LabelLog()
            let debouncer = Debouncer(delay: .seconds(10), leading: leading, scheduler: manual)
            debouncer.call { log.add("first") }
            debouncer.call { log.add("flushed") }
            debouncer.flush()
            debouncer.call { log.add("newer") }
            manual.advance(by: .seconds(30))
            let expected = leading ? ["first", "flushed", "newer"] : ["flushed", "newer"]
            #expect(log.all == expected, "leading: \(leading)")
            #expect(manual.pendingCount == 0)
        }
    }

    @Test("A trailing run that came due while an action ran is superseded by a newer call before it begins")
    func dueRunSupersededByNewerCall() {
        for leading in [false, true] {
            let delay = Duration.milliseconds(20)
            let debouncer = Debouncer(delay: delay, leading: leading)
            let log = LabelLog()
            let release = DispatchSemaphore(value: 0)
            let started = DispatchSemaphore(value: 0)
            let done = DispatchSemaphore(value: 0)
            let clock = ContinuousClock()
            let firstCall = clock.now
            debouncer.call {
                started.signal()
                release.wait()
                log.add("A")
            }
            started.wait()
            debouncer.call { log.add("B") }
            // B belongs to A's burst only if it came within the delay (not so on a loaded machine).
            let sameBurst = clock.now - firstCall < delay
            usleep(100_000)  // B's quiet period passes while A runs
            debouncer.call {
                log.add("C")
                done.signal()
            }
            release.signal()
            #expect(done.wait(timeout: .now() + 10) == .success)
            usleep(20_000)
            if sameBurst || !leading {
                #expect(!log.all.contains("B"), "leading: \(leading): \(log.all)")
            }
            #expect(log.all.last == "C", "leading: \(leading): \(log.all)")
            debouncer.cancel()
        }
    }

    @Test("With leading: true, the debouncer never runs an older call after a newer one (real time)")
    func leadingRunsInCallOrder() {
        let rounds = Int(ProcessInfo.processInfo.environment["ATTACK_ROUNDS"] ?? "40") ?? 40
        var failed: [String] = []
        for round in 0..<rounds {
            let debouncer = Debouncer(delay: .microseconds(200), leading: true, queue: .global())
            let runs = CallIndexLog()
            let running = Atomic<Int>(0)
            let overlaps = Atomic<Int>(0)
            let calls = 300
            for index in 0..<calls {
                debouncer.call {
                    if running.add(1, ordering: .relaxed).newValue > 1 { overlaps.add(1, ordering: .relaxed) }
                    defer { running.subtract(1, ordering: .relaxed) }
                    usleep(150)
                    runs.add(index)
                }
                if index % 7 == 0 { usleep(250) }
            }
            let start = DispatchTime.now()
            while runs.all.last != calls - 1,
                DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds < 5_000_000_000
            {
                usleep(200)
            }
            usleep(5_000)
            debouncer.cancel()
            let seen = runs.all
            let outOfOrder = zip(seen, seen.dropFirst()).filter { $0 >= $1 }
            if !outOfOrder.isEmpty || seen.last != calls - 1 || overlaps.load(ordering: .relaxed) > 0 {
                failed.append(
                    "round \(round): overlaps \(overlaps.load(ordering: .relaxed)), out of order \(outOfOrder.prefix(3)), last \(seen.last ?? -1), tail \(seen.suffix(6))"
                )
            }
        }
        print("leadingRunsInCallOrder: \(failed.count) of \(rounds) rounds failed")
        #expect(failed == [])
    }

    @Test("With leading: true, a leading call queued behind a running action never runs after the newer trailing call")
    func leadingQueuedBehindRunningAction() {
        let rounds = Int(ProcessInfo.processInfo.environment["ATTACK_ROUNDS"] ?? "10") ?? 10
        var failed: [String] = []
        for round in 0..<rounds {
            let debouncer = Debouncer(delay: .milliseconds(5), leading: true, queue: .global())
            let log = LabelLog()
            let release = DispatchSemaphore(value: 0)
            let started = DispatchSemaphore(value: 0)
            debouncer.call {
                started.signal()
                release.wait()
                log.add("A")
            }
            started.wait()
            usleep(20_000)  // quiet for longer than the delay: the next call starts a burst
            debouncer.call { log.add("L") }  // leading: due at once, waits for A
            debouncer.call { log.add("T") }  // the latest call: trailing, due in 5 ms
            usleep(20_000)  // T comes due while A still runs
            release.signal()
            // T runs within milliseconds; under ThreadSanitizer beside other
            // suites the global queue's workers can be held for longer.
            waitUntil { log.all.contains("T") }
            usleep(50_000)  // a leading call run late would show by now
            debouncer.cancel()
            let runs = log.all
            if runs != ["A", "L", "T"] && runs != ["A", "T"] { failed.append("round \(round): \(runs)") }
        }
        print("leadingQueuedBehindRunningAction: \(failed.count) of \(rounds) rounds failed: \(failed.prefix(3))")
        #expect(failed == [])
    }

    @Test("With leading: true on a blocked serial queue, an older call never runs after the latest one")
    func leadingOnBlockedQueue() {
        let rounds = Int(ProcessInfo.processInfo.environment["ATTACK_ROUNDS"] ?? "10") ?? 10
        var failed: [String] = []
        for round in 0..<rounds {
            let queue = DispatchQueue(label: "attack.blocked")
            let debouncer = Debouncer(delay: .milliseconds(5), leading: true, queue: queue)
            let log = LabelLog()
            let release = DispatchSemaphore(value: 0)
            debouncer.call { log.add("P") }  // leading, delivered at once
            usleep(20_000)
            queue.async { release.wait() }  // the queue is busy with something else
            debouncer.call { log.add("Q") }  // trailing-free burst: leading, delivered, not begun
            debouncer.call { log.add("R") }  // trailing, due in 5 ms
            usleep(20_000)  // R comes due, delivered behind the blocker
            debouncer.call { log.add("S") }  // after the quiet: leading of a new burst? or supersedes R
            debouncer.call { log.add("U") }  // latest call
            usleep(20_000)
            release.signal()
            usleep(50_000)
            queue.sync {}
            debouncer.cancel()
            let runs = log.all
            if runs.last != "U" { failed.append("round \(round): \(runs)") }
        }
        print("leadingOnBlockedQueue: \(failed.count) of \(rounds) rounds failed: \(failed.prefix(3))")
        #expect(failed == [])
    }

    @Test(
        "With leading: true, a leading call that finds a trailing run queued and not begun runs before the newer calls")
    func leadingBehindQueuedTrailingRun() {
        let rounds = Int(ProcessInfo.processInfo.environment["ATTACK_ROUNDS"] ?? "10") ?? 10
        var failed: [String] = []
        var valid = 0
        var attempts = 0
        // A round counts only when its setting held: the blocker began before R
        // ran. Under ThreadSanitizer on a busy machine R can come due and run
        // before the blocker is queued (then P, R, L, T is right).
        while valid < rounds && attempts < 3 * rounds {
            attempts += 1
            let queue = DispatchQueue(label: "attack.serial")
            let debouncer = Debouncer(delay: .milliseconds(40), leading: true, queue: queue)
            let log = LabelLog()
            let release = DispatchSemaphore(value: 0)
            debouncer.call { log.add("P") }  // leading: runs at once
            debouncer.call { log.add("R") }  // same burst: trailing, due in 40 ms
            queue.async {  // after P, the queue is busy with something else
                log.add("blocker")
                release.wait()
            }
            usleep(100_000)  // R comes due and is queued behind the blocker (not begun)
            debouncer.call { log.add("L") }  // a new burst's leading call
            debouncer.call { log.add("T") }  // the latest call
            usleep(100_000)  // T comes due
            release.signal()
            waitUntil { log.all.contains("T") }  // on a busy machine T can be delivered late
            usleep(20_000)
            queue.sync {}
            debouncer.cancel()
            let all = log.all
            guard let blocker = all.firstIndex(of: "blocker"), all.firstIndex(of: "R").map({ $0 > blocker }) ?? true
            else { continue }
            valid += 1
            let runs = all.filter { $0 != "blocker" }
            if runs != ["P", "L", "T"] { failed.append("attempt \(attempts): \(runs)") }
        }
        print(
            "leadingBehindQueuedTrailingRun: \(failed.count) of \(valid) rounds failed "
                + "(\(attempts - valid) set up wrong): \(failed.prefix(3))")
        #expect(valid > 0, "no round where the blocker began before R")
        #expect(failed == [])
    }

    @Test("A debouncer's action that calls, flushes and cancels its own debouncer neither deadlocks nor overlaps")
    func reentrantDebouncer() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let debouncer = Debouncer(delay: .seconds(1), leading: true, scheduler: manual)
        debouncer.call {
            log.add("first")
            debouncer.call { log.add("second") }
            debouncer.flush()
            debouncer.call { log.add("third") }
        }
        manual.advance(by: .seconds(5))
        // first (leading), second (flushed: always runs), third (latest call).
        #expect(log.all == ["first", "second", "third"])
        debouncer.call {
            debouncer.cancel()
            log.add("cancelled-self")
        }
        manual.advance(by: .seconds(5))
        #expect(log.all.last == "cancelled-self")
        #expect(manual.pendingCount == 0)
    }

    @Test("A zero-delay leading debouncer runs a burst at one instant as first then latest, in one advance")
    func zeroDelayLeadingBurst() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let debouncer = Debouncer(delay: .zero, leading: true, scheduler: manual)
        debouncer.call { log.add("a") }
        debouncer.call { log.add("b") }
        debouncer.call { log.add("c") }
        manual.advance(by: .zero)
        #expect(log.all == ["a", "c"])
        #expect(manual.pendingCount == 0)
    }

    @Test("A debouncer's cancel from another thread waits for the running action, and nothing begins after it")
    func debouncerCancelIsABarrier() {
        for round in 0..<20 {
            let debouncer = Debouncer(delay: .microseconds(100), leading: round % 2 == 0)
            let running = Atomic<Bool>(false)
            let began = Atomic<Int>(0)
            let started = DispatchSemaphore(value: 0)
            debouncer.call {
                running.store(true, ordering: .relaxed)
                started.signal()
                usleep(5_000)
                running.store(false, ordering: .relaxed)
            }
            started.wait()
            for _ in 0..<10 { debouncer.call { began.add(1, ordering: .relaxed) } }
            debouncer.flush()
            debouncer.cancel()
            let stillRunning = running.load(ordering: .relaxed)
            #expect(!stillRunning)
            let after = began.load(ordering: .relaxed)
            usleep(5_000)
            #expect(began.load(ordering: .relaxed) == after)
        }
    }

    @Test("flush() then call(): the flushed action still runs, then the new one after its quiet period")
    func flushThenCall() {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .seconds(1), scheduler: manual)
        let ran = StateLock<[String]>([])
        debouncer.call { ran.withLock { $0.append("A@\(manual.now)") } }
        debouncer.flush()
        debouncer.call { ran.withLock { $0.append("B@\(manual.now)") } }
        debouncer.flush()
        debouncer.call { ran.withLock { $0.append("C@\(manual.now)") } }
        manual.advance(by: .seconds(5))
        #expect(ran.withLock { $0 } == ["A@0.0 seconds", "B@0.0 seconds", "C@1.0 seconds"])
    }

    @Test("leading debounce: the first call of a burst made while an action runs runs right after it")
    func leadingCallWhileRunning() {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .seconds(1), leading: true, scheduler: manual)
        let ran = StateLock<[String]>([])
        debouncer.call { ran.withLock { $0.append("A@\(manual.now)") } }
        debouncer.call {
            ran.withLock { $0.append("B@\(manual.now)") }
            debouncer.call { ran.withLock { $0.append("X@\(manual.now)") } }  // a new burst's first call
        }
        manual.advance(by: .seconds(5))
        #expect(ran.withLock { $0 } == ["A@0.0 seconds", "B@1.0 seconds", "X@1.0 seconds"])
    }
}
