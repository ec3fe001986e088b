import Dispatch
import SafeTimers
import SafeTimersTesting
import Synchronization
import Testing

/// The call sites of `../shared/API.md`, written exactly as there: the contract
/// users, docs and outside tests are written against. This file failing to compile
/// means a name, a label or a parameter order changed. Each test also checks the
/// one-line semantics the contract states beside the call, on virtual time.
@Suite("API contract (API.md call sites)")
struct APIContractTests {
    final class Interactor: Sendable {
        let fetches = Counter()
        func fetchWallPosts() { fetches.increment() }
    }

    final class Recorder: Sendable {
        private let storage = StateLock<[Int]>([])
        func append(_ value: Int) { storage.withLock { $0.append(value) } }
        var values: [Int] { storage.withLock { $0 } }
    }

    @Test("Scheduler: advance, pendingCount, now; a primitive keeps its scheduler alive")
    func scheduler() {
        let system = SystemTimerScheduler.shared
        let manual = ManualTimerScheduler()
        let ran = Counter()
        let work = DelayedWork.schedule(after: .seconds(10), scheduler: manual) { ran.increment() }
        #expect(manual.pendingCount == 1)
        manual.advance(by: .seconds(30))
        #expect(ran.count == 1 && work.state == .completed)
        #expect(manual.pendingCount == 0)
        #expect(manual.now == .seconds(30))
        _ = system
    }

    @Test("Clocks: sleep, waitForSleepers, instants, schedule(at:), reschedule(after:)")
    func clocks() async throws {
        let clock: TimerClock = SystemTimerScheduler.shared.clock
        try await clock.sleep(for: .milliseconds(1))
        let manual = ManualTimerScheduler()
        let done = Counter()
        let t = Task {
            try await manual.clock.sleep(for: .seconds(5)); done.increment()
        }
        await manual.waitForSleepers(1)
        manual.advance(by: .seconds(5))
        try await t.value
        #expect(done.count == 1)
        let deadline = manual.clock.now.advanced(by: .seconds(2))
        let refreshes = Counter()
        let work = DelayedWork.schedule(at: deadline, scheduler: manual) { refreshes.increment() }
        let moved: Bool = work.reschedule(after: .seconds(3))
        #expect(moved)
        manual.advance(by: .seconds(2))
        #expect(refreshes.count == 0)
        manual.advance(by: .seconds(1))
        #expect(refreshes.count == 1)
    }

    @Test("Watchdog: armed at once, kick, invalidate, hasFired, kick(timeout:)")
    func watchdog() {
        let manual = ManualTimerScheduler()
        let logs = Counter()
        let dog = Watchdog(timeout: .seconds(2), scheduler: manual) { logs.increment() }
        manual.advance(by: .seconds(1))
        dog.kick()
        manual.advance(by: .seconds(1.5))
        #expect(!dog.hasFired && logs.count == 0)
        dog.kick(timeout: .seconds(5))
        manual.advance(by: .seconds(4.9))
        #expect(!dog.hasFired)
        manual.advance(by: .seconds(0.2))
        #expect(dog.hasFired && logs.count == 1)
        dog.kick()
        manual.advance(by: .seconds(10))
        #expect(logs.count == 1, "kick has no effect after it fired")
        dog.invalidate()
        dog.invalidate()
    }

    @Test("withWatchdog (sync and async) and withTimeout")
    func scopedForms() async throws {
        let reports = Counter()
        @Sendable func report() { reports.increment() }
        @Sendable func work() throws -> Int { 1 }
        @Sendable func asyncWork() async throws -> Int { 2 }
        @Sendable func fetch() async throws -> Int { 3 }
        let value = try withWatchdog(timeout: .milliseconds(500), onTimeout: { report() }) { try work() }
        let value2 = try await withWatchdog(timeout: .milliseconds(500), onTimeout: { report() }) {
            try await asyncWork()
        }
        let value3 = try await withTimeout(.seconds(1)) { try await fetch() }
        #expect(value == 1 && value2 == 2 && value3 == 3 && reports.count == 0)
        await #expect(throws: TimeoutError.self) {
            try await withTimeout(.milliseconds(10)) { try await Task.sleep(for: .seconds(60)) }
        }
    }

    @Test("RepeatingTimer: states, fireCount, every option label, ticks, owner-bound form")
    func repeatingTimer() async {
        let manual = ManualTimerScheduler()
        let sent = Counter()
        @Sendable func sendEvents() { sent.increment() }
        let timer = RepeatingTimer(interval: .seconds(30), scheduler: manual) { sendEvents() }
        #expect(timer.state == .idle)
        timer.start()
        #expect(timer.state == .running)
        manual.advance(by: .seconds(30))
        #expect(timer.fireCount == 1)
        timer.suspend()
        #expect(timer.state == .suspended)
        timer.resume()
        #expect(timer.state == .running)
        timer.cancel()
        #expect(timer.state == .cancelled)
        timer.start()
        #expect(timer.state == .running && timer.fireCount == 0, "restart after cancel; fireCount since the last start")
        timer.cancel()

        let queue = DispatchQueue(label: "contract")
        let finite = RepeatingTimer(
            interval: .seconds(1), leeway: .milliseconds(10), repetitions: 2, firesImmediately: true,
            missedTicks: .catchUp(limit: 3), queue: queue, scheduler: manual
        ) {}
        finite.start()
        manual.advance(by: .seconds(5))
        #expect(finite.state == .finished && finite.fireCount == 2)
        let states: [TimerState] = [.idle, .running, .suspended, .cancelled, .finished]
        let policies: [MissedTickPolicy] = [.skip, .coalesce, .catchUp(limit: 1)]
        #expect(states.count == 5 && policies.count == 3)

        let ticking = RepeatingTimer(interval: .seconds(1), repetitions: 3, scheduler: manual) {}
        let ticks = ticking.ticks
        ticking.start()
        manual.advance(by: .seconds(3))
        var received = 0
        for await _ in ticks { received += 1 }
        #expect(received == 3, "ticks end when the timer finishes")

        var interactor: Interactor? = Interactor()
        let poll = RepeatingTimer(interval: .seconds(15), owner: interactor!, scheduler: manual) { interactor in
            interactor.fetchWallPosts()
        }
        poll.start()
        manual.advance(by: .seconds(15))
        #expect(interactor?.fetches.count == 1)
        interactor = nil
        manual.advance(by: .seconds(15))
        #expect(poll.state == .cancelled, "cancels itself once the owner is gone")
    }

    @Test("DelayedWork: schedule(after:on:scheduler:), cancel() -> Bool, state")
    func delayedWork() {
        let manual = ManualTimerScheduler()
        let queue = DispatchQueue(label: "contract")
        let refreshes = Counter()
        @Sendable func refresh() { refreshes.increment() }
        let work = DelayedWork.schedule(after: .seconds(2), on: queue, scheduler: manual) { refresh() }
        #expect(work.state == .pending)
        let prevented = work.cancel()
        #expect(prevented && work.state == .cancelled)
        #expect(!work.cancel(), "true only if this call stopped the run")
        manual.advance(by: .seconds(5))
        #expect(refreshes.count == 0)
        let states: [DelayedWork.State] = [.pending, .running, .completed, .cancelled]
        #expect(states.count == 4)
    }

    @Test("Rate limiting: Debouncer call/cancel/flush, Throttler latest and first")
    func rateLimiting() {
        let manual = ManualTimerScheduler()
        let searches = Counter()
        @Sendable func search(_ query: String) { searches.increment() }
        let query = "swift"
        let debouncer = Debouncer(delay: .milliseconds(300), scheduler: manual)
        debouncer.call { search(query) }
        debouncer.call { search(query) }
        manual.advance(by: .milliseconds(300))
        #expect(searches.count == 1)
        debouncer.call { search(query) }
        debouncer.cancel()
        manual.advance(by: .seconds(1))
        #expect(searches.count == 1)
        let saved = Recorder()
        let throttler = Throttler(interval: .seconds(1), scheduler: manual)
        throttler.call { saved.append(1) }
        throttler.call { saved.append(2) }
        throttler.call { saved.append(3) }
        manual.advance(by: .seconds(1))
        #expect(saved.values == [1, 3], "the first at once, the latest call of the window at its end")
        debouncer.call { search(query) }
        debouncer.flush()
        manual.advance(by: .zero)  // under ManualTimerScheduler handlers run inside advance
        #expect(searches.count == 2)
        let kept = Recorder()
        let first = Throttler(interval: .seconds(1), latest: false, scheduler: manual)
        first.call { kept.append(1) }
        first.call { kept.append(2) }
        first.call { kept.append(3) }
        manual.advance(by: .seconds(2))
        #expect(
            kept.values == [1, 2], "keeps the first call of a window instead (as Combine's throttle(latest: false))")
    }
}
