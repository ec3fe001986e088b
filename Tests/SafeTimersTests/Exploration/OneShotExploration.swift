@testable @_spi(SchedulerImplementation) import SafeTimers

/// A `DelayedWork` in a ``PrimitiveWorld``: calls are `cancel`, `reschedule`
/// (to 10 ms from now) and `reschedulePast` (to 5 ms ago: as soon as
/// possible). It must run at most once, never after a cancel that returned
/// `true`, and at rest be completed or cancelled, with nothing pending.
struct DelayedWorkSystem: ExplorableSystem {
    let world = PrimitiveWorld(elapse: .milliseconds(15))
    let work: DelayedWork
    let runs = RunCounter()
    private var preventedByCancel = false

    init() {
        let runs = self.runs
        work = DelayedWork.schedule(
            atTicks: world.engine.nowTicks + 10_000_000, executor: world.executor, engine: world.engine
        ) { runs.increment() }
    }

    func enabledSteps() -> [PrimitiveStep] {
        world.steps(calls: ["cancel", "reschedule", "reschedulePast"], passed: { work.hasPassed($0) })
    }

    mutating func perform(_ step: PrimitiveStep) {
        switch step {
        case .call("cancel", let thread):
            let effects = work.transition { $0.cancel(thread: thread) }
            if effects.preventedRun { preventedByCancel = true }
            world.cancelled(on: thread, ticket: work.completeReturningTicket(effects))
        case .call(let name, _):
            let deadline = world.now + (name == "reschedulePast" ? -5_000_000 : 10_000_000)
            _ = work.completeReturningTicket(work.transition { $0.reschedule(to: deadline) })
            world.collect()
        default:
            let work = self.work
            world.performNonCall(
                step,
                begin: { tag, worker in
                    guard let body = work.begin(tag: tag, thread: worker) else { return false }
                    body()
                    return true
                }, end: { work.end() }, passWaiter: { _ = work.passWaiter($0) })
        }
    }

    var violation: String? {
        if let violation = world.violation { return violation }
        if runs.count > 1 { return "ran \(runs.count) times" }
        if preventedByCancel && runs.count > 0 { return "ran although cancel() returned true" }
        return nil
    }

    mutating func finish() -> String? {
        let work = self.work
        let runs = self.runs
        _ = world.runToRest(
            passed: { work.hasPassed($0) },
            begin: { tag, worker in
                guard let body = work.begin(tag: tag, thread: worker) else { return false }
                body()
                return true
            },
            end: { _ in work.end() })
        if let violation { return violation }
        if world.manual.pendingCount != 0 { return "\(world.manual.pendingCount) pending at rest" }
        switch work.state {
        case .completed: return runs.count == 1 ? nil : "completed without running"
        case .cancelled: return runs.count == 0 && !work.holdsWork ? nil : "cancelled but ran or kept its closure"
        case .pending, .running: return "\(work.state) at rest"
        }
    }
}

/// A `Watchdog` (timeout 10 ms) in a ``PrimitiveWorld``: calls are `kick`,
/// `kickLonger` (`kick(timeout: 30 ms)`), `kickShorter` (`kick(timeout: 5 ms)`)
/// and `invalidate`. It must fire at most once, never before now + timeout of
/// the last kick that came before the deadline was reached, never after
/// `invalidate()` returned, and at rest have fired unless invalidated, with
/// nothing pending; a kick returns true exactly when it came before the
/// deadline (and before `invalidate()`).
struct WatchdogSystem: ExplorableSystem {
    let world = PrimitiveWorld(elapse: .milliseconds(4))
    let core: WatchdogCore
    let runs = RunCounter()
    private var earliestAllowed: Int64 = 10_000_000
    private var delivered = false
    private var invalidated = false

    init() {
        let runs = self.runs
        core = WatchdogCore.armed(
            timeout: .milliseconds(10), executor: world.executor, engine: EngineReference(world.manual)
        ) { runs.increment() }
    }

    func enabledSteps() -> [PrimitiveStep] {
        world.steps(calls: ["kick", "kickLonger", "kickShorter", "invalidate"], passed: { core.hasPassed($0) })
    }

    mutating func perform(_ step: PrimitiveStep) {
        switch step {
        case .call("invalidate", let thread):
            invalidated = true
            world.cancelled(
                on: thread, ticket: core.completeReturningTicket(core.transition { $0.invalidate(thread: thread) }))
        case .call(let name, _):
            let timeout: Duration? =
                switch name {
                case "kickLonger": .milliseconds(30)
                case "kickShorter": .milliseconds(5)
                default: nil
                }
            let now = world.now
            // A kick counts before the deadline only; at or after it, it is
            // refused even if the engine has not fired yet.
            let effective = !delivered && !invalidated && now < earliestAllowed
            let effects = core.transition { $0.kick(now: now, timeout: timeout) }
            _ = core.completeReturningTicket(effects)
            if effects.movedDeadline != effective {
                world.violation =
                    "kick at \(now) ns (deadline \(earliestAllowed) ns) returned \(effects.movedDeadline)"
            }
            if effective {
                earliestAllowed = now + DeadlineArithmetic.nanoseconds(core.timeout)
            }
            noteDeliveries()
        default:
            let core = self.core
            world.performNonCall(
                step,
                begin: { tag, worker in
                    guard let body = core.begin(tag: tag, thread: worker) else { return false }
                    body()
                    return true
                }, end: { core.end() }, passWaiter: { _ = core.passWaiter($0) })
            noteDeliveries()
        }
    }

    private mutating func noteDeliveries() {
        guard !world.deliveries.isEmpty, !delivered else { return }
        delivered = true
        if world.now < earliestAllowed {
            world.violation = "fired at \(world.now) ns, before its deadline \(earliestAllowed) ns"
        }
    }

    var violation: String? {
        if let violation = world.violation { return violation }
        if runs.count > 1 { return "fired \(runs.count) times" }
        return nil
    }

    mutating func finish() -> String? {
        let core = self.core
        _ = world.runToRest(
            passed: { core.hasPassed($0) },
            begin: { tag, worker in
                guard let body = core.begin(tag: tag, thread: worker) else { return false }
                body()
                return true
            },
            end: { _ in core.end() })
        if let violation { return violation }
        if !invalidated && runs.count != 1 { return "never fired, though never invalidated" }
        if world.manual.pendingCount != 0 { return "\(world.manual.pendingCount) pending at rest" }
        if !core.hasFired && core.holdsHandler && invalidated { return "invalidated but kept its handler" }
        return nil
    }
}
