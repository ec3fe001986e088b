import Dispatch
import SafeTimersTesting
import Synchronization
import Testing

@testable import SafeTimers

/// Lets a handler reach the timer it belongs to.
final class TimerBox: Sendable {
    private let storage = StateLock<RepeatingTimer?>(nil)
    var timer: RepeatingTimer? {
        get { storage.withLock { $0 } }
        set { storage.withLock { $0 = newValue } }
    }
}

@Suite("RepeatingTimer (virtual time)")
struct RepeatingTimerTests {
    @Test("an hour of a 30 s timer fires exactly 120 times on the grid")
    func anHour() {
        let manual = ManualTimerScheduler()
        let times = StateLock<[Duration]>([])
        let timer = RepeatingTimer(interval: .seconds(30), scheduler: manual) {
            times.withLock { $0.append(manual.now) }
        }
        #expect(timer.state == .idle)
        timer.start()
        manual.advance(by: .seconds(3600))
        let fired = times.withLock { $0 }
        #expect(fired.count == 120)
        #expect(fired.first == .seconds(30))
        #expect(fired.last == .seconds(3600))
        #expect(timer.fireCount == 120)
        #expect(zip(fired, fired.dropFirst()).allSatisfy { $1 - $0 == .seconds(30) })
    }

    enum Call: String, CaseIterable, CustomStringConvertible {
        case start, suspend, resume, cancel
        var description: String { rawValue }
        func apply(to timer: RepeatingTimer) {
            switch self {
            case .start: timer.start()
            case .suspend: timer.suspend()
            case .resume: timer.resume()
            case .cancel: timer.cancel()
            }
        }
    }

    static let transitions: [(TimerState, Call, TimerState)] = [
        (.idle, .start, .running), (.idle, .suspend, .idle), (.idle, .resume, .idle), (.idle, .cancel, .cancelled),
        (.running, .start, .running), (.running, .suspend, .suspended), (.running, .resume, .running),
        (.running, .cancel, .cancelled),
        (.suspended, .start, .suspended), (.suspended, .suspend, .suspended), (.suspended, .resume, .running),
        (.suspended, .cancel, .cancelled),
        (.cancelled, .start, .running), (.cancelled, .suspend, .cancelled), (.cancelled, .resume, .cancelled),
        (.cancelled, .cancel, .cancelled),
        (.finished, .start, .running), (.finished, .suspend, .finished), (.finished, .resume, .finished),
        (.finished, .cancel, .cancelled),
    ]

    /// A timer of 3 repetitions, 1 s apart, whose handler counts into `fired` (and
    /// runs `also`), brought into `state`.
    static func timer(
        in state: TimerState, scheduler: ManualTimerScheduler, fired: Counter,
        also: @escaping @Sendable () -> Void = {}
    ) -> RepeatingTimer {
        let timer = RepeatingTimer(interval: .seconds(1), repetitions: 3, scheduler: scheduler) {
            also()
            fired.increment()
        }
        switch state {
        case .idle: break
        case .running: timer.start()
        case .suspended:
            timer.start()
            timer.suspend()
        case .cancelled:
            timer.start()
            timer.cancel()
        case .finished:
            timer.start()
            scheduler.advance(by: .seconds(3))
        }
        #expect(timer.state == state)
        return timer
    }

    @Test("every call from every state", arguments: transitions)
    func transition(from: TimerState, call: Call, to: TimerState) {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        let timer = Self.timer(in: from, scheduler: manual, fired: fired)
        let before = fired.count
        call.apply(to: timer)
        #expect(timer.state == to)
        manual.advance(by: .seconds(1))
        let ticked = fired.count - before
        #expect(ticked == (to == .running ? 1 : 0), "after \(call) from \(from)")
        // Whatever happened, the timer can always be driven back to a clean finish.
        timer.cancel()
        timer.start()
        manual.advance(by: .seconds(10))
        #expect(timer.state == .finished)
        #expect(timer.fireCount == 3)
        #expect(manual.pendingCount == 0)
    }

    @Test("every call from inside the handler", arguments: Call.allCases)
    func callFromHandler(call: Call) {
        let manual = ManualTimerScheduler()
        let box = TimerBox()
        let fired = Counter()
        let timer = RepeatingTimer(interval: .seconds(1), scheduler: manual) {
            fired.increment()
            if fired.count == 2, let timer = box.timer { call.apply(to: timer) }
        }
        box.timer = timer
        timer.start()
        manual.advance(by: .seconds(5))
        switch call {
        case .start, .resume:
            #expect(timer.state == .running)
            #expect(fired.count == 5)
        case .suspend:
            #expect(timer.state == .suspended)
            #expect(fired.count == 2)
            timer.resume()
            manual.advance(by: .seconds(1))
            #expect(fired.count == 3)
        case .cancel:
            #expect(timer.state == .cancelled)
            #expect(fired.count == 2)
        }
        box.timer = nil
    }

    @Test("cancel and restart from inside the handler starts a fresh cadence")
    func restartFromHandler() {
        let manual = ManualTimerScheduler()
        let box = TimerBox()
        let times = StateLock<[Duration]>([])
        let timer = RepeatingTimer(interval: .seconds(2), scheduler: manual) {
            times.withLock { $0.append(manual.now) }
            if manual.now == .seconds(2), let timer = box.timer {
                timer.cancel()
                timer.start()
            }
        }
        box.timer = timer
        timer.start()
        manual.advance(by: .seconds(6))
        #expect(times.withLock { $0 } == [.seconds(2), .seconds(4), .seconds(6)])
        #expect(timer.fireCount == 2, "fireCount counts since the last start")
        box.timer = nil
    }

    @Test("finite repetitions end in finished, and restart counts again")
    func finite() {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        let timer = RepeatingTimer(interval: .seconds(1), repetitions: 3, scheduler: manual) { fired.increment() }
        timer.start()
        manual.advance(by: .seconds(2))
        #expect(timer.state == .running)
        manual.advance(by: .seconds(1))
        #expect(timer.state == .finished)
        #expect(fired.count == 3)
        #expect(manual.pendingCount == 0)
        timer.start()
        manual.advance(by: .seconds(10))
        #expect(fired.count == 6)
        #expect(timer.fireCount == 3)
    }

    @Test("firesImmediately runs the first tick at start, in the next advance under a manual scheduler")
    func firesImmediately() {
        let manual = ManualTimerScheduler()
        let times = StateLock<[Duration]>([])
        let timer = RepeatingTimer(interval: .seconds(10), repetitions: 3, firesImmediately: true, scheduler: manual) {
            times.withLock { $0.append(manual.now) }
        }
        timer.start()
        #expect(timer.fireCount == 0, "no handler runs outside advance")
        manual.advance(by: .zero)
        #expect(timer.fireCount == 1)
        manual.advance(by: .seconds(60))
        #expect(times.withLock { $0 } == [.zero, .seconds(10), .seconds(20)])
        #expect(timer.state == .finished)
    }

    @Test("suspend drops the cadence; resume ticks one interval later")
    func suspendResume() {
        let manual = ManualTimerScheduler()
        let times = StateLock<[Duration]>([])
        let timer = RepeatingTimer(interval: .seconds(10), scheduler: manual) {
            times.withLock { $0.append(manual.now) }
        }
        timer.start()
        manual.advance(by: .seconds(15))
        timer.suspend()
        manual.advance(by: .seconds(100))
        timer.resume()
        manual.advance(by: .seconds(25))
        #expect(times.withLock { $0 } == [.seconds(10), .seconds(125), .seconds(135)])
    }

    /// A handler that, on its first invocation, holds the clock for 3.5 intervals
    /// (the handler "falls behind"): ticks at 2, 3 and 4 s fall due while it runs.
    func fallBehind(_ policy: MissedTickPolicy) -> [Duration] {
        let manual = ManualTimerScheduler()
        let times = StateLock<[Duration]>([])
        let timer = RepeatingTimer(interval: .seconds(1), missedTicks: policy, scheduler: manual) {
            let first = times.withLock { times in
                times.append(manual.now)
                return times.count == 1
            }
            if first { manual.advance(by: .milliseconds(3500)) }
        }
        timer.start()
        manual.advance(by: .seconds(5))
        return times.withLock { $0 }
    }

    @Test("skip: ticks missed while the handler runs are dropped")
    func skip() {
        #expect(fallBehind(.skip) == [.seconds(1), .seconds(5)])
    }

    @Test("coalesce: missed ticks earn one invocation right after the handler returns")
    func coalesce() {
        #expect(fallBehind(.coalesce) == [.seconds(1), .milliseconds(4500), .seconds(5)])
    }

    @Test("catchUp: each missed tick runs back to back, up to the limit")
    func catchUp() {
        let t = Duration.milliseconds(4500)
        #expect(fallBehind(.catchUp(limit: 10)) == [.seconds(1), t, t, t, .seconds(5)])
        #expect(fallBehind(.catchUp(limit: 2)) == [.seconds(1), t, t, .seconds(5)])
        #expect(fallBehind(.catchUp(limit: 0)) == [.seconds(1), t, .seconds(5)])
    }

    @Test("zero and negative intervals are raised to the minimum: no busy loop")
    func nonPositiveInterval() {
        for interval in [Duration.zero, .seconds(-1), .nanoseconds(1)] {
            let manual = ManualTimerScheduler()
            let fired = Counter()
            let timer = RepeatingTimer(interval: interval, scheduler: manual) { fired.increment() }
            #expect(timer.interval == RepeatingTimer.minimumInterval)
            timer.start()
            manual.advance(by: .seconds(1))
            #expect(fired.count == 1000)
        }
    }

    @Test("an interval too long to represent never ticks")
    func overflowingInterval() {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        let timer = RepeatingTimer(interval: .seconds(Int64.max), scheduler: manual) { fired.increment() }
        timer.start()
        manual.advance(by: .seconds(Int64.max))
        #expect(fired.count == 0)
        #expect(timer.state == .running)
        timer.cancel()
        #expect(manual.pendingCount == 0)
    }

    @Test("zero or negative repetitions finish at start without calling the handler")
    func nonPositiveRepetitions() {
        for repetitions in [0, -5] {
            let manual = ManualTimerScheduler()
            let fired = Counter()
            let timer = RepeatingTimer(
                interval: .seconds(1), repetitions: repetitions, firesImmediately: true, scheduler: manual
            ) { fired.increment() }
            timer.start()
            #expect(timer.state == .finished)
            manual.advance(by: .seconds(10))
            #expect(fired.count == 0)
            #expect(manual.pendingCount == 0)
        }
    }

    @Test("ticks yields one element per invocation and ends when the timer finishes")
    func ticksFinish() async {
        let manual = ManualTimerScheduler()
        let timer = RepeatingTimer(interval: .seconds(1), repetitions: 3, scheduler: manual) {}
        let ticks = timer.ticks
        timer.start()
        manual.advance(by: .seconds(5))
        var seen: [RepeatingTimer.Tick] = []
        for await tick in ticks { seen.append(tick) }
        #expect(seen.map(\.number) == [1, 2, 3])
        #expect(seen.map(\.time) == [.seconds(1), .seconds(2), .seconds(3)])
    }

    @Test("ticks ends when the timer is cancelled, and at once for a cancelled timer")
    func ticksCancel() async {
        let manual = ManualTimerScheduler()
        let timer = RepeatingTimer(interval: .seconds(1), scheduler: manual) {}
        let ticks = timer.ticks
        timer.start()
        manual.advance(by: .seconds(2))
        timer.cancel()
        var count = 0
        for await _ in ticks { count += 1 }
        #expect(count == 2)
        for await _ in timer.ticks { Issue.record("a cancelled timer's stream must be empty") }
    }

    @Test(
        "releasing a timer in any state cancels it and frees its handler's captures",
        arguments: [
            TimerState.idle, .running, .suspended, .cancelled, .finished,
        ])
    func releaseCancels(state: TimerState) {
        let manual = ManualTimerScheduler()
        let released = Counter()
        let fired = Counter()
        do {
            let captured = Tracked { released.increment() }
            _ = Self.timer(in: state, scheduler: manual, fired: fired, also: { captured.touch() })
        }
        let before = fired.count
        manual.advance(by: .seconds(10))
        #expect(fired.count == before)
        #expect(released.count == 1)
        #expect(manual.pendingCount == 0)
    }
}

@Suite("Owner-bound RepeatingTimer (virtual time)")
struct OwnerBoundTimerTests {
    final class Interactor: Sendable {
        let fetches = Counter()
        func fetchWallPosts() { fetches.increment() }
    }

    @Test("passes the owner in, never keeps it alive, and cancels once it is gone")
    func ownerLifetime() {
        let manual = ManualTimerScheduler()
        var interactor: Interactor? = Interactor()
        weak let probe = interactor
        let fetches = interactor!.fetches
        let poll = RepeatingTimer(interval: .seconds(15), owner: interactor!, scheduler: manual) { interactor in
            interactor.fetchWallPosts()
        }
        poll.start()
        manual.advance(by: .seconds(30))
        #expect(fetches.count == 2)
        interactor = nil
        #expect(probe == nil, "the timer must not keep its owner alive")
        manual.advance(by: .seconds(15))
        #expect(poll.state == .cancelled)
        #expect(fetches.count == 2)
        #expect(manual.pendingCount == 0)
    }

    @Test("an owner that holds its own timer is released with it")
    func ownerHoldsTimer() {
        final class Screen: Sendable {
            let box = TimerBox()
            let refreshes = Counter()
            init(scheduler: ManualTimerScheduler) {
                let timer = RepeatingTimer(interval: .seconds(1), owner: self, scheduler: scheduler) { screen in
                    screen.refreshes.increment()
                }
                box.timer = timer
                timer.start()
            }
        }
        let manual = ManualTimerScheduler()
        var screen: Screen? = Screen(scheduler: manual)
        weak let probe = screen
        manual.advance(by: .seconds(3))
        #expect(screen?.refreshes.count == 3)
        screen = nil
        #expect(probe == nil)
        #expect(manual.pendingCount == 0, "the owner's deinit released the timer, which cancelled it")
    }
}
