import SafeTimersTesting
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// Virtual time runs everything in one total order: deadline first, then the
/// order of arming; work armed during an advance for an instant already reached
/// (the zero-delay rule) runs at the next instant the advance reaches, still in
/// that order, and is pending, counted and cancellable like any other.
@Suite("Virtual time: one total order, counted and cancellable")
struct VirtualTimeOrderTests {
    /// What ran, in order.
    private final class Log: Sendable {
        private let names = StateLock<[String]>([])
        func append(_ name: String) { names.withLock { $0.append(name) } }
        var all: [String] { names.withLock { $0 } }
    }

    @Test("swift-nio's task ordering: zero-delay work armed at 5 ns runs before the entry due at 10 ns")
    func nioTaskOrdering() {
        let manual = ManualTimerScheduler()
        let log = Log()
        var works: [DelayedWork] = []
        works.append(DelayedWork.schedule(after: .zero, scheduler: manual) { log.append("execute") })
        for name in ["first", "second"] {
            works.append(
                DelayedWork.schedule(after: .nanoseconds(5), scheduler: manual) {
                    log.append(name)
                    _ = DelayedWork.schedule(after: .zero, scheduler: manual) { log.append("\(name)'s execute") }
                })
        }
        works.append(DelayedWork.schedule(after: .nanoseconds(10), scheduler: manual) { log.append("10ns") })
        manual.advance(by: .nanoseconds(10))
        #expect(log.all == ["execute", "first", "second", "first's execute", "second's execute", "10ns"])
        #expect(manual.pendingCount == 0)
    }

    @Test("work armed during an advance for an instant already passed, then cancelled, is no longer pending")
    func cancelledDeferredWorkIsNotPending() {
        let manual = ManualTimerScheduler()
        let log = Log()
        let armed = StateLock<DelayedWork?>(nil)
        let cancelled = StateLock<Bool?>(nil)
        let a = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            let past = manual.instant.advanced(by: .milliseconds(-500))
            armed.withLock { $0 = DelayedWork.schedule(at: past, scheduler: manual) { log.append("past") } }
        }
        let b = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            cancelled.withLock { $0 = armed.withLock { $0 }?.cancel() }
        }
        manual.advance(by: .seconds(1))
        #expect(cancelled.withLock { $0 } == true)
        #expect(manual.pendingCount == 0)
        manual.advance(by: .seconds(1))
        #expect(log.all.isEmpty)
        #expect(manual.pendingCount == 0)
        _ = (a, b)
    }

    @Test("work rescheduled during an advance into the past, then cancelled, is no longer pending")
    func cancelledRescheduledWorkIsNotPending() {
        let manual = ManualTimerScheduler()
        let log = Log()
        let later = DelayedWork.schedule(after: .seconds(10), scheduler: manual) { log.append("later") }
        let cancelled = StateLock<Bool?>(nil)
        let a = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            later.reschedule(at: manual.instant.advanced(by: .milliseconds(-500)))
        }
        let b = DelayedWork.schedule(after: .seconds(1), scheduler: manual) {
            cancelled.withLock { $0 = later.cancel() }
        }
        manual.advance(by: .seconds(1))
        #expect(cancelled.withLock { $0 } == true)
        #expect(manual.pendingCount == 0)
        manual.advance(by: .seconds(20))
        #expect(log.all.isEmpty)
        _ = (a, b)
    }

    @Test(
        "random programs: runs, cancels, reschedules and pendingCount match a model of the total order",
        arguments: 0..<40)
    func randomProgramsMatchTheModel(seed: UInt64) {
        let program = RandomTimerProgram(seed: seed)
        let real = program.runOnEngine()
        let model = program.runOnModel()
        #expect(real == model, "seed \(seed)")
    }
}

/// A deterministic random program of `DelayedWork`s on a manual scheduler:
/// works scheduled at instants (some in the past, some equal), whose handlers
/// schedule, cancel and reschedule others, advanced in random steps. Run on the
/// engine and on a model of the promised order; both give a trace of what ran
/// when, what each cancel and reschedule returned, and `pendingCount` after
/// each step and inside each handler.
struct RandomTimerProgram: Sendable {
    /// What a handler does when it runs.
    enum Action: Sendable {
        case schedule(offset: Int64)  // at now + offset ms (negative: in the past)
        case cancel(Int)  // the work with this number (if it exists yet)
        case reschedule(Int, offset: Int64)
    }

    let initial: [Int64]  // ms
    let actions: [[Action]]  // by work number: what its handler does
    let advances: [Int64]  // ms

    init(seed: UInt64) {
        var random = SplitMix(seed: seed)
        initial = (0..<6).map { _ in Int64(random.next() % 8) }
        actions = (0..<64).map { _ in
            (0..<Int(random.next() % 3)).map { _ -> Action in
                let offset = Int64(random.next() % 9) - 3
                switch random.next() % 4 {
                case 0: return .cancel(Int(random.next() % 24))
                case 1: return .reschedule(Int(random.next() % 24), offset: offset)
                default: return .schedule(offset: offset)
                }
            }
        }
        advances = (0..<12).map { _ in Int64(random.next() % 5) } + [1_000]
    }

    /// The trace of the program on a real manual scheduler.
    func runOnEngine() -> [String] {
        let manual = ManualTimerScheduler()
        let trace = StateLock<[String]>([])
        let works = StateLock<[DelayedWork]>([])
        let actions = self.actions
        @Sendable func schedule(at milliseconds: Int64) {
            works.withLock { list in
                let number = list.count
                let instant = TimerClock.Instant(ticks: milliseconds * 1_000_000)
                list.append(
                    DelayedWork.schedule(at: instant, scheduler: manual) {
                        let now = manual.engine.nowTicks / 1_000_000
                        trace.withLock { $0.append("run \(number) at \(now), pending \(manual.pendingCount)") }
                        for action in actions[min(number, actions.count - 1)] {
                            switch action {
                            case .schedule(let offset): schedule(at: now + offset)
                            case .cancel(let target):
                                let work = works.withLock { target < $0.count ? $0[target] : nil }
                                if let work { trace.withLock { $0.append("cancel \(target): \(work.cancel())") } }
                            case .reschedule(let target, let offset):
                                let work = works.withLock { target < $0.count ? $0[target] : nil }
                                let moved = work?.reschedule(at: TimerClock.Instant(ticks: (now + offset) * 1_000_000))
                                if let moved { trace.withLock { $0.append("reschedule \(target): \(moved)") } }
                            }
                        }
                    })
            }
        }
        for milliseconds in initial { schedule(at: milliseconds) }
        for step in advances {
            manual.advance(by: .milliseconds(step))
            trace.withLock {
                $0.append("advanced to \(manual.engine.nowTicks / 1_000_000), pending \(manual.pendingCount)")
            }
        }
        return trace.withLock { $0 }
    }

    /// The trace the promised order gives: deadline, then arming order; work
    /// armed during an advance for an instant already reached waits for the
    /// next instant the advance reaches, or the next advance.
    func runOnModel() -> [String] {
        var model = TimerModel()
        for milliseconds in initial { model.arm(nil, at: milliseconds) }
        var trace: [String] = []
        for step in advances {
            let target = model.now + step
            model.beginAdvance()
            while let number = model.next(until: target) {
                trace.append("run \(number) at \(model.now), pending \(model.pendingCount)")
                for action in actions[min(number, actions.count - 1)] {
                    switch action {
                    case .schedule(let offset): model.arm(nil, at: model.now + offset)
                    case .cancel(let target):
                        if target < model.works.count { trace.append("cancel \(target): \(model.cancel(target))") }
                    case .reschedule(let target, let offset):
                        if target < model.works.count {
                            trace.append("reschedule \(target): \(model.arm(target, at: model.now + offset))")
                        }
                    }
                }
            }
            model.now = max(model.now, target)
            trace.append("advanced to \(model.now), pending \(model.pendingCount)")
        }
        return trace
    }
}

/// The promised order of a manual scheduler, written plainly.
struct TimerModel {
    /// Per work: its deadline and arming number while pending, nil once run or cancelled.
    var works: [(deadline: Int64, sequence: Int)?] = []
    var now: Int64 = 0
    private var sequence = 0
    /// Armings up to this number may run at the current instant.
    private var barrier = 0

    var pendingCount: Int { works.filter { $0 != nil }.count }

    /// Arms a new work (`number` nil) or moves a pending one; whether it moved.
    @discardableResult
    mutating func arm(_ number: Int?, at deadline: Int64) -> Bool {
        sequence += 1
        guard let number else {
            works.append((deadline, sequence))
            return true
        }
        guard works[number] != nil else { return false }
        works[number] = (deadline, sequence)
        return true
    }

    mutating func cancel(_ number: Int) -> Bool {
        defer { works[number] = nil }
        return works[number] != nil
    }

    mutating func beginAdvance() { barrier = sequence }

    /// The next work to run in an advance to `target`, taken out; nil when none.
    mutating func next(until target: Int64) -> Int? {
        while true {
            let eligible = works.indices.filter { index in
                guard let work = works[index] else { return false }
                return work.deadline <= now && work.sequence <= barrier
            }
            if let first = eligible.min(by: {
                (works[$0]!.deadline, works[$0]!.sequence) < (works[$1]!.deadline, works[$1]!.sequence)
            }) {
                works[first] = nil
                return first
            }
            let later = works.compactMap { $0?.deadline }.filter { $0 > now && $0 <= target }.min()
            guard let later else { return nil }
            now = later
            barrier = sequence
        }
    }
}

/// A small seeded generator (SplitMix64).
struct SplitMix {
    private var state: UInt64
    init(seed: UInt64) { state = seed &+ 0x9E37_79B9_7F4A_7C15 }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
