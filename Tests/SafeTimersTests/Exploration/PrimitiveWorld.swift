import SafeTimersTesting

@testable @_spi(SchedulerImplementation) import SafeTimers

/// One step of a primitive's world.
enum PrimitiveStep: CustomStringConvertible {
    /// A public call (by name) made on a simulated thread.
    case call(String, UInt)
    /// Virtual time moves to the next armed deadline and the engine fires it.
    case fire
    /// Virtual time moves on by the world's small step.
    case elapse
    /// The executor reaches the recorded delivery at this index, on a free worker.
    case begin(Int)
    /// The handler running on this worker returns.
    case end(UInt)
    /// The cancel that blocks this thread returns (its invocation has ended).
    case unblock(UInt)

    var description: String {
        switch self {
        case .call(let name, let thread): "\(PrimitiveWorld.name(of: thread)).\(name)"
        case .fire: "fire"
        case .elapse: "elapse"
        case .begin(let index): "begin#\(index)"
        case .end(let thread): "\(PrimitiveWorld.name(of: thread)).end"
        case .unblock(let thread): "\(PrimitiveWorld.name(of: thread)).cancelReturns"
        }
    }
}

/// The environment a primitive is explored in: a manual scheduler, a recording
/// executor, one caller thread and two worker threads that run deliveries, all
/// simulated on the test's own thread (thread ids are plain numbers the gate
/// compares). It tracks what the invariants need: who runs a handler, who is
/// blocked in a cancel, and whether a cancel has returned with no restart since
/// (then nothing may begin).
final class PrimitiveWorld {
    static let caller: UInt = 1
    static let workers: [UInt] = [2, 3]

    static func name(of thread: UInt) -> String {
        switch thread {
        case caller: "caller"
        case 2: "workerA"
        default: "workerB"
        }
    }

    let manual = ManualTimerScheduler()
    let recorder = DeliveryRecorder()
    let elapseStep: Duration
    /// Recorded deliveries not begun yet (stale ones included: they must not run).
    private(set) var deliveries: [UInt64] = []
    /// Worker → the tag whose handler it runs.
    private(set) var running: [UInt: UInt64] = [:]
    /// Thread → the ticket its cancel waits for.
    private(set) var blocked: [UInt: WaitTicket] = [:]
    /// A cancel has returned and no call that restarts has come since.
    var quiet = false
    /// Handler runs that began, ever, and the most that ran at once.
    private(set) var begun = 0
    private(set) var mostAtOnce = 0
    var violation: String?

    init(elapse: Duration) {
        elapseStep = elapse
    }

    var executor: HandlerExecutor { .recorder(recorder) }
    var engine: TimerEngine { manual.engine }
    var now: Int64 { engine.nowTicks }

    /// Threads that may make a call now: the caller unless blocked, and each
    /// worker inside a handler (calls from inside the handler).
    var callers: [UInt] {
        var threads = blocked[Self.caller] == nil ? [Self.caller] : []
        threads += Self.workers.filter { running[$0] != nil && blocked[$0] == nil }
        return threads
    }

    /// Every step the world allows besides the calls.
    func steps(calls: [String], passed: (WaitTicket) -> Bool) -> [PrimitiveStep] {
        var steps: [PrimitiveStep] = []
        for thread in callers {
            for call in calls { steps.append(.call(call, thread)) }
        }
        if let next = engine.nextDeadline, next != Int64.max { steps.append(.fire) }
        steps.append(.elapse)
        if Self.workers.contains(where: { running[$0] == nil }) {
            for index in deliveries.indices { steps.append(.begin(index)) }
        }
        for worker in Self.workers where running[worker] != nil && blocked[worker] == nil {
            steps.append(.end(worker))
        }
        for (thread, ticket) in blocked.sorted(by: { $0.key < $1.key }) where passed(ticket) {
            steps.append(.unblock(thread))
        }
        return steps
    }

    /// Performs any step but a call. `begin` runs the first half of delivery
    /// `tag` on `worker` (and the handler) and says whether it began; `end` runs
    /// the second half; `passWaiter` unregisters the waiter of a returning cancel.
    func performNonCall(
        _ step: PrimitiveStep, begin: (UInt64, UInt) -> Bool, end: () -> Void, passWaiter: (WaitTicket) -> Void
    ) {
        switch step {
        case .call: preconditionFailure("calls are the system's own")
        case .fire: fire()
        case .elapse: elapse()
        case .begin(let index):
            let (tag, worker) = takeDelivery(index)
            if begin(tag, worker) { began(tag, on: worker) }
        case .end(let worker):
            end()
            ended(on: worker)
        case .unblock(let thread):
            if let ticket = blocked[thread] { passWaiter(ticket) }
            unblock(thread)
        }
    }

    /// Takes what the executor recorded.
    func collect() {
        deliveries += recorder.takeAll().map(\.tag)
    }

    func fire() {
        if let next = engine.nextDeadline, next != Int64.max { engine.advance(toTicks: next) }
        collect()
    }

    func elapse() {
        manual.advance(by: elapseStep)
        collect()
    }

    /// Takes the delivery at `index` and the worker that runs it.
    func takeDelivery(_ index: Int) -> (tag: UInt64, worker: UInt) {
        let tag = deliveries.remove(at: index)
        return (tag, Self.workers.first { running[$0] == nil }!)
    }

    /// The handler of `tag` began on `worker`.
    func began(_ tag: UInt64, on worker: UInt) {
        if quiet { violation = "a handler began after cancel returned, with no restart since" }
        running[worker] = tag
        begun += 1
        mostAtOnce = max(mostAtOnce, running.count)
        if running.count > 1 { violation = "two invocations of the handler overlap" }
    }

    func ended(on worker: UInt) {
        running[worker] = nil
        collect()
    }

    /// A cancel-like call made on `thread` returned `ticket` (nil: it returned
    /// at once).
    func cancelled(on thread: UInt, ticket: WaitTicket?) {
        collect()
        if let ticket {
            blocked[thread] = ticket
        } else {
            cancelReturned(on: thread)
        }
    }

    func unblock(_ thread: UInt) {
        blocked[thread] = nil
        cancelReturned(on: thread)
    }

    private func cancelReturned(on thread: UInt) {
        // A restart made while this cancel was blocked may legitimately run.
        guard restartedWhileBlocked.remove(thread) == nil else { return }
        if running.contains(where: { $0.key != thread }) {
            violation = "cancel returned while the handler still ran on another thread"
        }
        quiet = true
    }

    /// Threads blocked in a cancel while some call restarted the primitive: when
    /// they return, a run may legitimately be in progress.
    private var restartedWhileBlocked: Set<UInt> = []

    /// A call that restarts the primitive (start, call) was made.
    func restarted() {
        quiet = false
        restartedWhileBlocked.formUnion(blocked.keys)
    }

    /// Runs the world to rest with no more user calls: every delivery begins and
    /// ends, every blocked cancel returns, time moves to each next deadline.
    /// `begin` and `end` perform the primitive's halves; returns false if the
    /// world did not come to rest within `limit` rounds.
    func runToRest(
        limit: Int = 200, passed: (WaitTicket) -> Bool, begin: (UInt64, UInt) -> Bool, end: (UInt) -> Void
    ) -> Bool {
        for _ in 0..<limit {
            if let (thread, _) = blocked.first(where: { passed($0.value) }) {
                unblock(thread)
                continue
            }
            if let worker = running.keys.sorted().first {
                end(worker)
                ended(on: worker)
                continue
            }
            if !deliveries.isEmpty {
                let (tag, worker) = takeDelivery(0)
                if begin(tag, worker) { began(tag, on: worker) }
                continue
            }
            guard let next = engine.nextDeadline, next != Int64.max else { return true }
            fire()
        }
        return false
    }
}
