@testable @_spi(SchedulerImplementation) import SafeTimers

/// Whether an explored debouncer also runs the first call of a burst.
protocol DebouncerEdge { static var leading: Bool { get } }
enum TrailingOnly: DebouncerEdge { static let leading = false }
enum LeadingToo: DebouncerEdge { static let leading = true }

/// A `Debouncer` (delay 10 ms, trailing or also leading) in a
/// ``PrimitiveWorld``: calls are `call` (each with a new number), `flush` and
/// `cancel`. Only the latest call, one that was flushed, or (leading) the first
/// of a burst may run; each call at most once, in the order made (the last run
/// is the latest call); not before its delay unless flushed or leading; at rest
/// the last call, every flushed one and every leading one have run unless a
/// cancel came after them, and nothing is pending. A burst ends at its quiet
/// period, a flush (pending or not) or a cancel.
struct DebouncerSystem<Edge: DebouncerEdge>: ExplorableSystem {
    let world = PrimitiveWorld(elapse: .milliseconds(6))
    let core: DebouncerCore
    let log = RunLog()
    private var calls: [Int64] = []  // call number → when it was made
    private var flushed: Set<Int> = []
    private var leadingCalls: Set<Int> = []
    private var burstOpen = false
    private var cancelledAfter: Int = -1  // the last call a cancel came after

    init() {
        core = DebouncerCore(
            delay: .milliseconds(10), leading: Edge.leading, executor: world.executor, engine: world.engine)
    }

    func enabledSteps() -> [PrimitiveStep] {
        world.steps(calls: ["call", "flush", "cancel"], passed: { core.hasPassed($0) })
    }

    mutating func perform(_ step: PrimitiveStep) {
        switch step {
        case .call("call", _):
            let number = calls.count
            let log = self.log
            calls.append(world.now)
            if Edge.leading && !burstOpen { leadingCalls.insert(number) }
            burstOpen = true
            let deadline = world.now + 10_000_000
            _ = core.completeReturningTicket(
                core.transition {
                    $0.call(RateLimitedAction(run: { log.record(number) }, onMainActor: false), deadline: deadline)
                })
            world.restarted()
            world.collect()
        case .call("flush", _):
            if core.storage.withLock({ $0.machine.hasPending }), !calls.isEmpty, !log.numbers.contains(calls.count - 1)
            {
                flushed.insert(calls.count - 1)
            }
            _ = core.completeReturningTicket(core.transition { $0.flush() })
            burstOpen = false
            world.collect()
        case .call(_, let thread):
            cancelledAfter = calls.count - 1
            burstOpen = false
            world.cancelled(
                on: thread, ticket: core.completeReturningTicket(core.transition { $0.cancel(thread: thread) }))
        default:
            let core = self.core
            world.performNonCall(
                step, begin: { begin($0, $1) }, end: { core.end() }, passWaiter: { _ = core.passWaiter($0) })
            // Time moving on may end the quiet period, which closes the burst.
            switch step {
            case .fire, .elapse: burstOpen = core.storage.withLock { $0.machine.inBurst }
            default: break
            }
        }
    }

    private func begin(_ tag: UInt64, _ worker: UInt) -> Bool {
        guard let action = core.begin(tag: tag, thread: worker) else { return false }
        action()
        let number = log.numbers.last!
        let exempt = flushed.contains(number) || leadingCalls.contains(number)
        if number != calls.count - 1 && !exempt {
            world.violation = "call \(number) ran although call \(calls.count - 1) came after it"
        }
        if log.numbers.count > 1 && log.numbers[log.numbers.count - 2] > number {
            world.violation = "call \(number) ran after the later call \(log.numbers[log.numbers.count - 2])"
        }
        if !exempt && world.now < calls[number] + 10_000_000 {
            world.violation = "call \(number) ran before its quiet period was over"
        }
        return true
    }

    var violation: String? {
        if let violation = world.violation { return violation }
        if Set(log.numbers).count != log.numbers.count { return "a call ran twice: \(log.numbers)" }
        return nil
    }

    mutating func finish() -> String? {
        let this = self
        _ = world.runToRest(
            passed: { this.core.hasPassed($0) }, begin: { tag, worker in this.begin(tag, worker) },
            end: { _ in this.core.end() })
        if let violation { return violation }
        if !calls.isEmpty && cancelledAfter < calls.count - 1 && !log.numbers.contains(calls.count - 1) {
            return "the last call (\(calls.count - 1)) never ran: \(log.numbers)"
        }
        for number in flushed where number > cancelledAfter && !log.numbers.contains(number) {
            return "flushed call \(number) never ran: \(log.numbers)"
        }
        for number in leadingCalls where number > cancelledAfter && !log.numbers.contains(number) {
            return "leading call \(number) never ran: \(log.numbers)"
        }
        if world.manual.pendingCount != 0 { return "\(world.manual.pendingCount) pending at rest" }
        return nil
    }
}

/// A `Throttler` (interval 10 ms, latest or first kept) in a ``PrimitiveWorld``:
/// calls are `call` (each with a new number) and `cancel`. Runs must begin at
/// least one interval apart and never overlap; at rest, with `latest`, the last
/// call has run unless a cancel came after it.
struct ThrottlerSystem<Keep: ThrottlerKeep>: ExplorableSystem {
    let world = PrimitiveWorld(elapse: .milliseconds(4))
    let core: ThrottlerCore
    let log = RunLog()
    private var callCount = 0
    private var begins: [Int64] = []
    private var cancelledSinceLast = false

    init() {
        core = ThrottlerCore(
            interval: .milliseconds(10), latest: Keep.latest, executor: world.executor, engine: world.engine)
    }

    func enabledSteps() -> [PrimitiveStep] {
        world.steps(calls: ["call", "cancel"], passed: { core.hasPassed($0) })
    }

    mutating func perform(_ step: PrimitiveStep) {
        switch step {
        case .call("call", _):
            let number = callCount
            let log = self.log
            callCount += 1
            cancelledSinceLast = false
            let now = world.now
            _ = core.completeReturningTicket(
                core.transition {
                    $0.call(RateLimitedAction(run: { log.record(number) }, onMainActor: false), now: now)
                })
            world.restarted()
            world.collect()
        case .call(_, let thread):
            cancelledSinceLast = true
            world.cancelled(
                on: thread, ticket: core.completeReturningTicket(core.transition { $0.cancel(thread: thread) }))
        default:
            let core = self.core
            world.performNonCall(
                step, begin: { begin($0, $1) }, end: { core.end() }, passWaiter: { _ = core.passWaiter($0) })
        }
    }

    private mutating func begin(_ tag: UInt64, _ worker: UInt) -> Bool {
        guard let action = core.begin(tag: tag, thread: worker) else { return false }
        action()
        if let previous = begins.last, world.now - previous < 10_000_000 {
            world.violation = "runs began \(world.now - previous) ns apart, interval 10 ms"
        }
        begins.append(world.now)
        return true
    }

    var violation: String? {
        if let violation = world.violation { return violation }
        if Set(log.numbers).count != log.numbers.count { return "a call ran twice: \(log.numbers)" }
        if Keep.latest && log.numbers != log.numbers.sorted() { return "calls ran out of order: \(log.numbers)" }
        return nil
    }

    mutating func finish() -> String? {
        var this = self
        _ = world.runToRest(
            passed: { this.core.hasPassed($0) }, begin: { tag, worker in this.begin(tag, worker) },
            end: { _ in this.core.end() })
        self = this
        if let violation { return violation }
        if Keep.latest && callCount > 0 && !cancelledSinceLast && log.numbers.last != callCount - 1 {
            return "the last call (\(callCount - 1)) never ran: \(log.numbers)"
        }
        if !Keep.latest && callCount > 0 && !cancelledSinceLast && log.numbers.isEmpty {
            return "no call ran"
        }
        return nil
    }
}

protocol ThrottlerKeep { static var latest: Bool { get } }
enum KeepLatest: ThrottlerKeep { static let latest = true }
enum KeepFirst: ThrottlerKeep { static let latest = false }

/// The numbers of the calls that ran, in order (exploring thread only).
final class RunLog: @unchecked Sendable {
    // Only touched on the exploring thread; Sendable so actions can capture it.
    private(set) var numbers: [Int] = []
    func record(_ number: Int) { numbers.append(number) }
}
