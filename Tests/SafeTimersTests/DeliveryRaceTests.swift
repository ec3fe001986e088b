import Dispatch
import Foundation
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// Real-time races between deliveries, cancels, reschedules and released
/// schedulers, many primitives due together: each run happens once or is
/// prevented, cancel stays a barrier, order holds where it is promised, and
/// everything is freed.
@Suite("Deliveries racing cancels, releases and each other (real time)")
struct DeliveryRaceTests {
    final class Capture: Sendable {}

    final class Box<T>: @unchecked Sendable {
        let lock = NSLock()
        var value: T
        init(_ value: T) { self.value = value }
        func with<R>(_ body: (inout T) -> R) -> R {
            lock.lock()
            defer { lock.unlock() }
            return body(&value)
        }
    }

    /// Many private schedulers made and dropped on 4 threads, each with a few
    /// DelayedWorks (half cancelled, handles dropped): every uncancelled one
    /// runs exactly once, every cancel that returned true prevented its run,
    /// and every engine and capture is freed in the end.
    @Test func privateSchedulerChurnRunsEverythingAndFreesEngines() async {
        let threads = 4
        let perThread = 150
        let ran = Box<[Int: Int]>([:])
        let prevented = Box<Set<Int>>([])
        let engines = Box<[() -> Bool]>([])  // is-freed checks
        let captures = Box<[() -> Bool]>([])
        let group = DispatchGroup()
        for t in 0..<threads {
            group.enter()
            Thread.detachNewThread {
                for i in 0..<perThread {
                    let id = t * 10_000 + i
                    var scheduler: SystemTimerScheduler? = SystemTimerScheduler()
                    weak let engine = scheduler!.engine
                    engines.with { $0.append({ engine == nil }) }
                    let capture = Capture()
                    weak let weakCapture = capture
                    captures.with { $0.append({ weakCapture == nil }) }
                    let work = DelayedWork.schedule(
                        after: .microseconds(Int64(i % 3) * 300), scheduler: scheduler!
                    ) {
                        _ = capture
                        ran.with { $0[id, default: 0] += 1 }
                    }
                    scheduler = nil
                    if i % 2 == 0 {
                        if work.cancel() {
                            prevented.with { _ = $0.insert(id) }
                        } else {
                            // cancel is a barrier: the run has finished.
                            let count = ran.with { $0[id] ?? 0 }
                            if count != 1 { Issue.record("cancel false but run count \(count) for \(id)") }
                        }
                    }
                }
                group.leave()
            }
        }
        let done = await eventually(within: 30) { group.wait(timeout: .now()) == .success }
        #expect(done)
        let total = threads * perThread
        let allRan = await eventually(within: 10) {
            ran.with { $0.count } + prevented.with { $0.count } == total
        }
        #expect(allRan, "ran \(ran.with { $0.count }) prevented \(prevented.with { $0.count }) of \(total)")
        let overlap = prevented.with { p in ran.with { r in p.filter { r[$0] != nil } } }
        #expect(overlap.isEmpty, "prevented but ran: \(overlap)")
        #expect(ran.with { $0.values.allSatisfy { $0 == 1 } })
        let capturesFreed = await eventually(within: 10) { captures.with { $0.allSatisfy { $0() } } }
        #expect(capturesFreed)
        // Retired engines end their thread within about a second of emptying.
        let enginesFreed = await eventually(within: 15) { engines.with { $0.allSatisfy { $0() } } }
        let left = engines.with { $0.filter { !$0() }.count }
        #expect(enginesFreed, "\(left) private engines still alive")
    }

    /// Two DelayedWorks due in one round go to the global queue in one hop:
    /// each handler waits until the other runs (the helper block must run the
    /// second), then each cancels the other (the parking cycle must be refused).
    @Test(.serialized, arguments: 0..<40) func mutualCancelInsideOneHopDoesNotDeadlock(_ round: Int) async {
        await Self.mutualCancel(bDelay: 0)
    }

    static func mutualCancel(bDelay: Int64) async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let aRunning = DispatchSemaphore(value: 0)
        let bRunning = DispatchSemaphore(value: 0)
        let finished = Atomic<Int>(0)
        let timedOut = Atomic<Int>(0)
        let works = Box<[DelayedWork]>([])
        let deadline = engine.nowTicks + 5_000_000
        let a = DelayedWork.schedule(atTicks: deadline, executor: .globalQueue, engine: engine) {
            aRunning.signal()
            if bRunning.wait(timeout: .now() + 30) == .timedOut { timedOut.add(1, ordering: .relaxed) }
            bRunning.signal()
            _ = works.with { $0[1] }.cancel()
            finished.add(1, ordering: .relaxed)
        }
        let b = DelayedWork.schedule(atTicks: deadline + bDelay, executor: .globalQueue, engine: engine) {
            bRunning.signal()
            if aRunning.wait(timeout: .now() + 30) == .timedOut { timedOut.add(1, ordering: .relaxed) }
            aRunning.signal()
            _ = works.with { $0[0] }.cancel()
            finished.add(1, ordering: .relaxed)
        }
        works.with { $0 = [a, b] }
        // A mate's helper block needs a worker of the global queue: other suites
        // running beside this one can hold every worker for seconds (one CI run
        // waited more than 5 s), so the waits are long; a deadlock waits forever.
        let ok = await eventually(within: 60) { finished.load(ordering: .relaxed) == 2 }
        #expect(ok, "finished \(finished.load(ordering: .relaxed)) of 2 (deadlock?)")
        #expect(timedOut.load(ordering: .relaxed) == 0, "a handler waited 30 s for its hop-mate")
        _ = scheduler
    }

    /// A serial queue: 300 works armed by one thread at deadlines with many
    /// ties, some handlers blocking 2 ms (helpers get sent): they must run in
    /// (deadline, arming) order, each once. The order is only defined when every
    /// work was armed before the first came due: a round where arming took longer
    /// (ThreadSanitizer on a busy machine) is tried again with a later start.
    @Test func serialQueueOrderWithBlockingHandlers() async {
        var lead: Int64 = 20_000_000
        for _ in 0..<4 {
            guard let (order, expected) = await serialQueueRound(lead: lead) else {
                lead *= 4
                continue
            }
            #expect(order.count == expected.count)
            if order != expected {
                let first = zip(order, expected).enumerated().first { $0.element.0 != $0.element.1 }
                Issue.record(
                    "order differs at \(first.map { "\($0.offset): got \($0.element.0) want \($0.element.1)" } ?? "length")"
                )
            }
            return
        }
        Issue.record("arming 300 works took longer than \(lead / 4_000_000) ms four times")
    }

    /// One round of `serialQueueOrderWithBlockingHandlers`: the order the works
    /// ran in and the order they must run in, or nil when arming all of them took
    /// longer than `lead` (the first could come due before the last was armed).
    private func serialQueueRound(lead: Int64) async -> (order: [Int], expected: [Int])? {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let queue = DispatchQueue(label: "attack.serial")
        let log = Box<[Int]>([])
        let count = 300
        let base = engine.nowTicks + lead
        var deadlines: [Int64] = []
        var works: [DelayedWork] = []
        var generator = SystemRandomNumberGenerator()
        for i in 0..<count {
            let deadline = base + Int64.random(in: 0..<40, using: &generator) * 250_000
            deadlines.append(deadline)
            works.append(
                DelayedWork.schedule(atTicks: deadline, executor: .queue(queue), engine: engine) {
                    log.with { $0.append(i) }
                    if i % 7 == 0 { usleep(2_000) }
                })
        }
        let armedInTime = engine.nowTicks < base
        let ok = await eventually(within: 20) { log.with { $0.count } >= count }
        #expect(ok)
        try? await Task.sleep(nanoseconds: 50_000_000)
        _ = (works, scheduler)
        guard armedInTime else { return nil }
        let expected = (0..<count).sorted { (deadlines[$0], $0) < (deadlines[$1], $1) }
        return (log.with { $0 }, expected)
    }

    /// Handlers due together that cancel the next one (maybe in their hop,
    /// maybe running on a helper): no deadlock; each work ran xor was prevented.
    @Test func chainOfCancelsInsideHopsOnGlobalQueue() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let count = 200
        let works = Box<[DelayedWork]>([])
        let ran = Box<[Int]>(Array(repeating: 0, count: count))
        let prevented = Box<[Int]>(Array(repeating: 0, count: count))
        let selfCancelTrue = Atomic<Int>(0)
        let finished = Atomic<Int>(0)
        let deadline = engine.nowTicks + 10_000_000
        var made: [DelayedWork] = []
        for i in 0..<count {
            made.append(
                DelayedWork.schedule(atTicks: deadline, executor: .globalQueue, engine: engine) {
                    ran.with { $0[i] += 1 }
                    // Under ThreadSanitizer making the 200 works took longer than
                    // the 10 ms to their deadline: the array is not there yet.
                    while works.with({ $0.isEmpty }) { usleep(100) }
                    let all = works.with { $0 }
                    if all[i].cancel() { selfCancelTrue.add(1, ordering: .relaxed) }
                    if i % 5 == 0 { usleep(1_500) }
                    if i + 1 < count, all[i + 1].cancel() { prevented.with { $0[i + 1] += 1 } }
                    finished.add(1, ordering: .relaxed)
                })
        }
        works.with { $0 = made }
        let ok = await eventually(within: 20) {
            let p = prevented.with { $0.reduce(0, +) }
            return finished.load(ordering: .relaxed) + p == count
        }
        #expect(ok, "finished \(finished.load(ordering: .relaxed)) prevented \(prevented.with { $0.reduce(0, +) })")
        #expect(selfCancelTrue.load(ordering: .relaxed) == 0)
        let r = ran.with { $0 }
        let p = prevented.with { $0 }
        for i in 0..<count where r[i] + p[i] != 1 {
            Issue.record("work \(i): ran \(r[i]) prevented \(p[i])")
        }
        _ = scheduler
    }

    /// cancel() racing the run from another thread, 3000 times: true means the
    /// closure never runs; false means it has already returned; either way its
    /// captures are gone when cancel returns.
    @Test func cancelRacingRunIsABarrier() async {
        let scheduler = SystemTimerScheduler()
        let count = 3000
        let problems = Box<[String]>([])
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            for i in 0..<count {
                let ran = Atomic<Int>(0)
                let (work, probe) = Self.makeWork(i: i, scheduler: scheduler) {
                    if i % 10 == 0 { usleep(200) }
                    ran.add(1, ordering: .relaxed)
                }
                weak let weakCapture = probe.value
                if i % 3 != 0 { usleep(UInt32(i % 60)) }
                let prevented = work.cancel()
                let runs = ran.load(ordering: .relaxed)
                if prevented && runs != 0 { problems.with { $0.append("\(i): prevented but ran") } }
                if !prevented && runs != 1 {
                    problems.with { $0.append("\(i): not prevented, runs \(runs) at return") }
                }
                if weakCapture != nil {
                    problems.with { $0.append("\(i): capture alive after cancel (prevented \(prevented))") }
                }
                if prevented { usleep(20) }
                if prevented && ran.load(ordering: .relaxed) != 0 {
                    problems.with { $0.append("\(i): ran after prevented") }
                }
            }
            done.signal()
        }
        let ok = await eventually(within: 60) { done.wait(timeout: .now()) == .success }
        #expect(ok)
        let found = problems.with { $0 }
        #expect(found.isEmpty, "\(found.count) problems, first: \(found.prefix(5))")
    }

    final class WeakBox: @unchecked Sendable {
        weak var value: Capture?
    }

    /// A work whose closure holds the only reference to a fresh capture.
    static func makeWork(
        i: Int, scheduler: SystemTimerScheduler, _ body: @escaping @Sendable () -> Void
    ) -> (DelayedWork, WeakBox) {
        let capture = Capture()
        let probe = WeakBox()
        probe.value = capture
        let work = DelayedWork.schedule(after: .microseconds(Int64(i % 50)), scheduler: scheduler) {
            _ = capture
            body()
        }
        return (work, probe)
    }

    /// Thread numbers: distinct for 2000 threads that start and end one after another.
    @Test func threadNumbersNeverReused() {
        let numbers = Box<[UInt]>([])
        for _ in 0..<2000 {
            let done = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                numbers.with { $0.append(ThreadIdentity.current()) }
                done.signal()
            }
            done.wait()
        }
        let all = numbers.with { $0 }
        #expect(Set(all).count == all.count)
        #expect(all.allSatisfy { $0 != 0 && $0 < 1 << 32 })
    }

    /// Private schedulers released at once, each with 40 works due together on
    /// the global queue, some blocking 3 ms (hops and helpers are pending when
    /// the scheduler goes): all run once, engines are freed.
    @Test func privateSchedulerReleasedWithHopsAndHelpersPending() async {
        let ran = Box<[Int]>(Array(repeating: 0, count: 400))
        var engines: [() -> Bool] = []
        for s in 0..<10 {
            var scheduler: SystemTimerScheduler? = SystemTimerScheduler()
            weak let engine = scheduler!.engine
            engines.append({ engine == nil })
            let deadline = scheduler!.engine.nowTicks + 3_000_000
            for i in 0..<40 {
                let id = s * 40 + i
                _ = DelayedWork.schedule(atTicks: deadline, executor: .globalQueue, engine: scheduler!.engine) {
                    if i % 4 == 0 { usleep(3_000) }
                    ran.with { $0[id] += 1 }
                }
            }
            scheduler = nil
        }
        let ok = await eventually(within: 20) { ran.with { $0.allSatisfy { $0 >= 1 } } }
        #expect(ok, "ran \(ran.with { $0.filter { $0 > 0 }.count }) of 400")
        #expect(ran.with { $0.allSatisfy { $0 == 1 } })
        let freed = await eventually(within: 15) { engines.allSatisfy { $0() } }
        #expect(freed, "\(engines.filter { !$0() }.count) engines alive")
    }

    /// 40 repeating timers of 2 ms, all due together: pairs cancel each other
    /// from their handlers at their 3rd tick (a cycle of waits), each cancels
    /// itself at its 6th; no handler overlaps itself, none begins after a
    /// cancel of it returned, nothing deadlocks.
    @Test func repeatingTimersCancellingEachOtherFromHandlers() async {
        let scheduler = SystemTimerScheduler()
        let count = 40
        let timers = Box<[RepeatingTimer]>([])
        let inHandler = Box<[Int]>(Array(repeating: 0, count: count))
        let cancelReturned = Box<[Bool]>(Array(repeating: false, count: count))
        let ticks = Box<[Int]>(Array(repeating: 0, count: count))
        let problems = Box<[String]>([])
        var made: [RepeatingTimer] = []
        for i in 0..<count {
            made.append(
                RepeatingTimer(interval: .milliseconds(2), scheduler: scheduler) {
                    if cancelReturned.with({ $0[i] }) {
                        problems.with { $0.append("timer \(i) began after a cancel of it returned") }
                    }
                    if inHandler.with({
                        $0[i] += 1; return $0[i]
                    }) != 1 {
                        problems.with { $0.append("timer \(i) overlaps itself") }
                    }
                    let tick = ticks.with {
                        $0[i] += 1; return $0[i]
                    }
                    let all = timers.with { $0 }
                    if tick == 3 {
                        usleep(1_000)
                        let other = i ^ 1
                        all[other].cancel()
                        // a refused (cyclic) wait may return while the other still runs
                    }
                    if tick == 6 { all[i].cancel() }
                    inHandler.with { $0[i] -= 1 }
                })
        }
        timers.with { $0 = made }
        for timer in made { timer.start() }
        let ok = await eventually(within: 20) { made.allSatisfy { $0.state == .cancelled } }
        #expect(ok, "states: \(made.map(\.state))")
        // cancel from outside now, then nothing may begin any more
        for (i, timer) in made.enumerated() {
            timer.cancel()
            cancelReturned.with { $0[i] = true }
        }
        try? await Task.sleep(nanoseconds: 30_000_000)
        let found = problems.with { $0 }
        #expect(found.isEmpty, "\(found.count) problems: \(found.prefix(5))")
    }

    /// Three works due together on a user *serial* queue, the first blocking
    /// 300 ms: nothing else is due, so the scheduler thread sleeps (a hop and
    /// its helper, queued behind the blocked handler, never involve it).
    @Test func blockedHopOnSerialQueueDoesNotSpinSchedulerThread() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let queue = DispatchQueue(label: "attack.serial.blocked")
        let deadline = engine.nowTicks + 5_000_000
        let done = Atomic<Int>(0)
        var works: [DelayedWork] = []
        for i in 0..<3 {
            works.append(
                DelayedWork.schedule(atTicks: deadline, executor: .queue(queue), engine: engine) {
                    if i == 0 { usleep(300_000) }
                    done.add(1, ordering: .relaxed)
                })
        }
        let start = DispatchTime.now().uptimeNanoseconds
        let ok = await eventually(within: 10) { done.load(ordering: .relaxed) == 3 }
        #expect(ok)
        let wakeUps = engine.wakeUpCount
        let elapsed = Int((DispatchTime.now().uptimeNanoseconds - start) / 1_000_000)
        #expect(wakeUps < 15 + elapsed / 32, "scheduler thread woke \(wakeUps) times in \(elapsed) ms")
        _ = works
    }

    /// The same on a suspended concurrent queue: a hop that cannot begin does
    /// not wake the scheduler thread until the queue is resumed.
    @Test func hopOnSuspendedQueueDoesNotSpinSchedulerThread() async {
        let scheduler = SystemTimerScheduler()
        let engine = scheduler.engine
        let queue = DispatchQueue(label: "attack.suspended", attributes: .concurrent)
        queue.suspend()
        let deadline = engine.nowTicks + 5_000_000
        let done = Atomic<Int>(0)
        var works: [DelayedWork] = []
        for _ in 0..<3 {
            works.append(
                DelayedWork.schedule(atTicks: deadline, executor: .queue(queue), engine: engine) {
                    done.add(1, ordering: .relaxed)
                })
        }
        let start = DispatchTime.now().uptimeNanoseconds
        try? await Task.sleep(nanoseconds: 300_000_000)
        let wakeUps = engine.wakeUpCount
        let elapsed = Int((DispatchTime.now().uptimeNanoseconds - start) / 1_000_000)
        queue.resume()
        let ok = await eventually(within: 10) { done.load(ordering: .relaxed) == 3 }
        #expect(ok)
        #expect(wakeUps < 15 + elapsed / 32, "scheduler thread woke \(wakeUps) times in \(elapsed) ms, nothing due")
        _ = works
    }

    /// reschedule racing the run: true means the run happens once, no earlier
    /// than the new delay after the call; false means it had begun (or ran).
    @Test func rescheduleRacingRunHonoursNewDeadline() async {
        let scheduler = SystemTimerScheduler()
        let count = 400
        let runs = Box<[Int]>(Array(repeating: 0, count: count))
        let runAt = Box<[UInt64]>(Array(repeating: 0, count: count))
        var calls: [(Bool, UInt64)] = []
        var works: [DelayedWork] = []
        for i in 0..<count {
            let work = DelayedWork.schedule(after: .microseconds(Int64(i % 40) * 25), scheduler: scheduler) {
                runs.with { $0[i] += 1 }
                runAt.with { $0[i] = DispatchTime.now().uptimeNanoseconds }
            }
            usleep(UInt32(i % 37) * 20)
            let before = DispatchTime.now().uptimeNanoseconds
            calls.append((work.reschedule(after: .milliseconds(30)), before))
            works.append(work)
        }
        let ok = await eventually(within: 10) { runs.with { $0.allSatisfy { $0 >= 1 } } }
        #expect(ok)
        try? await Task.sleep(nanoseconds: 50_000_000)
        var problems: [String] = []
        let r = runs.with { $0 }
        let at = runAt.with { $0 }
        for i in 0..<count {
            if r[i] != 1 { problems.append("\(i): ran \(r[i]) times") }
            if calls[i].0 && at[i] < calls[i].1 + 30_000_000 {
                problems.append(
                    "\(i): rescheduled (true) but ran \(Double(Int64(at[i]) - Int64(calls[i].1)) / 1e6) ms after the call"
                )
            }
        }
        #expect(problems.isEmpty, "\(problems.count) problems: \(problems.prefix(5))")
        _ = works
    }

    /// 40 main-actor works due together (hops of 16 through the main actor)
    /// plus 40 on DispatchQueue.main: each runs once, on the main actor, in
    /// arming order within its destination.
    @Test func mainActorHandlersDueTogether() async {
        let scheduler = SystemTimerScheduler()
        let log = Box<[Int]>([])
        let mainLog = Box<[Int]>([])
        let deadline = scheduler.clock.now.advanced(by: .milliseconds(5))
        var works: [DelayedWork] = []
        for i in 0..<40 {
            works.append(
                DelayedWork.schedule(at: deadline, scheduler: scheduler) { @MainActor in
                    log.with { $0.append(i) }
                })
            works.append(
                DelayedWork.schedule(at: deadline, on: .main, scheduler: scheduler) {
                    mainLog.with { $0.append(i) }
                })
        }
        let ok = await eventually(within: 10) { log.with { $0.count } == 40 && mainLog.with { $0.count } == 40 }
        #expect(ok, "main actor \(log.with { $0.count }), main queue \(mainLog.with { $0.count })")
        #expect(log.with { $0 } == Array(0..<40))
        #expect(mainLog.with { $0 } == Array(0..<40))
        _ = works
    }

    /// 30 watchdogs, debouncers and throttlers each, due together on one
    /// private scheduler (hops mix them): watchdogs fire once and may
    /// invalidate themselves inside; each debouncer runs only its last action
    /// once; each throttler runs its first call and then the last of the
    /// burst, never overlapping and at least the interval apart.
    @Test func watchdogsDebouncersThrottlersDueTogether() async {
        let scheduler = SystemTimerScheduler()
        let n = 30
        let (madeDogs, dogFired) = selfInvalidatingWatchdogs(count: n, scheduler: scheduler)
        let debounced = Box<[[Int]]>(Array(repeating: [], count: n))
        let debouncers = (0..<n).map { _ in Debouncer(delay: .milliseconds(4), scheduler: scheduler) }
        let throttled = ThrottledRuns(count: n, scheduler: scheduler)
        let burstBegan = DispatchTime.now().uptimeNanoseconds
        for k in 0..<5 {
            for i in 0..<n {
                debouncers[i].call { debounced.with { $0[i].append(k) } }
                throttled.call(i, k)
            }
        }
        // Under ThreadSanitizer the 300 calls took longer than one 4 ms interval:
        // a throttler then also runs a call from the middle of the burst
        // ([0, 3, 4]), as it should (a debouncer likewise, when its calls came
        // more than its delay apart).
        let burstFitsInterval = DispatchTime.now().uptimeNanoseconds - burstBegan < 4_000_000
        let ok = await eventually(within: 10) {
            dogFired.with { $0.allSatisfy { $0 >= 1 } } && debounced.with { $0.allSatisfy { !$0.isEmpty } }
                && throttled.runs.with { $0.allSatisfy { $0.last == 4 } }
        }
        #expect(ok)
        try? await Task.sleep(nanoseconds: 40_000_000)
        #expect(dogFired.with { $0.allSatisfy { $0 == 1 } }, "\(dogFired.with { $0 })")
        let allFired = madeDogs.allSatisfy { $0.hasFired }
        #expect(allFired)
        expectBurstRuns(debounced.with { $0 }, throttled.runs.with { $0 }, burstFitsInterval: burstFitsInterval)
        let found = throttled.problems()
        #expect(found.isEmpty, "\(found.prefix(5))")
        _ = debouncers
    }

    /// `count` watchdogs of 5 ms, each invalidating itself when it fires, and
    /// how often each fired.
    private func selfInvalidatingWatchdogs(
        count: Int, scheduler: SystemTimerScheduler
    ) -> ([Watchdog], Box<[Int]>) {
        let fired = Box<[Int]>(Array(repeating: 0, count: count))
        let dogs = Box<[Watchdog]>([])
        var made: [Watchdog] = []
        for i in 0..<count {
            made.append(
                Watchdog(timeout: .milliseconds(5), scheduler: scheduler) {
                    fired.with { $0[i] += 1 }
                    // The watchdogs may fire before all of them are made (ThreadSanitizer).
                    while dogs.with({ $0.isEmpty }) { usleep(100) }
                    dogs.with { $0 }[i].invalidate()
                })
        }
        dogs.with { $0 = made }
        return (made, fired)
    }

    /// Which of the burst's calls (0 to 4) each debouncer and throttler ran: only
    /// the last (debouncer) and the first and the last (throttler) when the burst
    /// fit in one interval; otherwise calls in increasing order, with the last
    /// (and, for a throttler, the first).
    private func expectBurstRuns(_ debounced: [[Int]], _ throttled: [[Int]], burstFitsInterval: Bool) {
        let increasing = { (runs: [Int]) in zip(runs, runs.dropFirst()).allSatisfy(<) }
        if burstFitsInterval {
            #expect(debounced.allSatisfy { $0 == [4] }, "\(debounced.prefix(5))")
            #expect(throttled.allSatisfy { $0 == [0, 4] }, "\(throttled.prefix(5))")
        } else {
            #expect(debounced.allSatisfy { $0.last == 4 && increasing($0) }, "\(debounced.prefix(5))")
            #expect(
                throttled.allSatisfy { $0.first == 0 && $0.last == 4 && increasing($0) }, "\(throttled.prefix(5))")
        }
    }

    /// Throttlers whose actions record which call ran, whether two runs
    /// overlapped, and when each run began.
    private final class ThrottledRuns: Sendable {
        let throttlers: [Throttler]
        /// The calls each throttler ran.
        let runs: Box<[[Int]]>
        private let running: Box<[Int]>
        private let overlaps = Box<[String]>([])
        /// When each run began: the throttler's own instant (a window starts
        /// there) and the action's first clock reading, which a preempted thread
        /// (ThreadSanitizer, two cores) takes later.
        private let begins: Box<[[Int64]]>
        private let starts: Box<[[UInt64]]>

        init(count: Int, scheduler: SystemTimerScheduler) {
            throttlers = (0..<count).map { _ in Throttler(interval: .milliseconds(4), scheduler: scheduler) }
            runs = Box(Array(repeating: [], count: count))
            running = Box(Array(repeating: 0, count: count))
            begins = Box(Array(repeating: [], count: count))
            starts = Box(Array(repeating: [], count: count))
        }

        /// Call `k` of the burst to throttler `i`.
        func call(_ i: Int, _ k: Int) {
            throttlers[i].call { [self] in
                if running.with({
                    $0[i] += 1
                    return $0[i]
                }) != 1 {
                    overlaps.with { $0.append("throttler \(i) overlaps") }
                }
                starts.with { $0[i].append(DispatchTime.now().uptimeNanoseconds) }
                let began = throttlers[i].storageForTesting.storage.withLock { $0.machine.lastBegin }
                begins.with { $0[i].append(began ?? -1) }
                runs.with { $0[i].append(k) }
                if k == 0 { usleep(500) }
                running.with { $0[i] -= 1 }
            }
        }

        /// Overlapping runs, and runs begun less than the interval apart.
        func problems() -> [String] {
            var found = overlaps.with { $0 }
            let starts = starts.with { $0 }
            for (i, begins) in begins.with({ $0 }).enumerated() {
                for k in begins.indices.dropFirst() where begins[k] - begins[k - 1] < 4_000_000 {
                    let seen = Double(starts[i][k] - starts[i][k - 1]) / 1e6
                    found.append(
                        "throttler \(i) runs began \(Double(begins[k] - begins[k - 1]) / 1e6) ms apart "
                            + "(\(seen) ms by the actions' clock)")
                }
            }
            return found
        }
    }

    @Test("two handlers that cancel each other's timer do not deadlock; each timer stops")
    func crossCancelDoesNotDeadlock() {
        let a = StateLock<RepeatingTimer?>(nil)
        let b = StateLock<RepeatingTimer?>(nil)
        let inA = DispatchSemaphore(value: 0)
        let inB = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let scheduler = SystemTimerScheduler()
        let timerA = RepeatingTimer(
            interval: .milliseconds(10), firesImmediately: true, queue: DispatchQueue(label: "A"), scheduler: scheduler
        ) {
            inA.signal()
            inB.wait()
            b.withLock { $0 }?.cancel()
            done.signal()
        }
        let timerB = RepeatingTimer(
            interval: .milliseconds(10), firesImmediately: true, queue: DispatchQueue(label: "B"), scheduler: scheduler
        ) {
            inB.signal()
            inA.wait()
            a.withLock { $0 }?.cancel()
            done.signal()
        }
        a.withLock { $0 = timerA }
        b.withLock { $0 = timerB }
        timerA.start()
        timerB.start()
        let first = done.wait(timeout: .now() + 20)
        let second = done.wait(timeout: .now() + 20)
        #expect(first == .success && second == .success, "two handlers cancelling each other's timer deadlocked")
        #expect(timerA.state == .cancelled && timerB.state == .cancelled)
        a.withLock { $0 = nil }
        b.withLock { $0 = nil }
    }
}
