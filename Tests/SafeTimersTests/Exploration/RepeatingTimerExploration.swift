@testable @_spi(SchedulerImplementation) import SafeTimers

/// A `RepeatingTimer` core in a ``PrimitiveWorld``. The configuration is chosen
/// by the type parameter so that one test explores several.
struct RepeatingTimerSystem<Configuration: RepeatingTimerExplorationConfiguration>: ExplorableSystem {
    let world = PrimitiveWorld(elapse: .milliseconds(15))
    let core: RepeatingTimerCore
    let runs = RunCounter()
    /// Handler runs since the last start that changed the state.
    private var runsSinceStart = 0

    init() {
        let runs = self.runs
        core = RepeatingTimerCore(
            configuration: Configuration.configuration, leeway: .zero, executor: world.executor,
            scheduler: world.manual, handler: .plain { runs.increment() })
    }

    static var calls: [String] { ["start", "suspend", "resume", "cancel"] }

    func enabledSteps() -> [PrimitiveStep] {
        world.steps(calls: Self.calls, passed: { core.hasPassed($0) })
    }

    mutating func perform(_ step: PrimitiveStep) {
        switch step {
        case .call(let name, let thread):
            let now = world.now
            switch name {
            case "start":
                let restarts = [.idle, .cancelled, .finished].contains(core.state)
                _ = core.completeReturningTicket(core.transition { $0.start(now: now) })
                world.collect()
                if restarts {
                    runsSinceStart = 0
                    world.restarted()
                }
            case "suspend":
                _ = core.completeReturningTicket(core.transition { $0.suspend() })
                world.collect()
            case "resume":
                _ = core.completeReturningTicket(core.transition { $0.resume(now: now) })
                world.collect()
            default:
                world.cancelled(
                    on: thread, ticket: core.completeReturningTicket(core.transition { $0.cancel(thread: thread) }))
            }
        default:
            let core = self.core
            world.performNonCall(
                step, begin: { begin($0, $1) }, end: { core.end() }, passWaiter: { _ = core.passWaiter($0) })
        }
    }

    private mutating func begin(_ tag: UInt64, _ worker: UInt) -> Bool {
        guard let tick = core.begin(tag: tag, thread: worker) else { return false }
        runsSinceStart += 1
        if tick.number != runsSinceStart { world.violation = "tick number \(tick.number) ≠ run \(runsSinceStart)" }
        return true
    }

    var violation: String? {
        if let violation = world.violation { return violation }
        if core.fireCount != runsSinceStart { return "fireCount \(core.fireCount) ≠ \(runsSinceStart) handler runs" }
        if let repetitions = Configuration.configuration.repetitions, core.fireCount > repetitions {
            return "ran \(core.fireCount) times, repetitions \(repetitions)"
        }
        return nil
    }

    mutating func finish() -> String? {
        var this = self
        let rested = world.runToRest(
            passed: { core.hasPassed($0) },
            begin: { tag, worker in this.begin(tag, worker) },
            end: { _ in core.end() })
        self = this
        if let violation { return violation }
        let state = core.state
        if let repetitions = Configuration.configuration.repetitions {
            if state == .running { return "a timer with repetitions \(repetitions) stays running at rest" }
            if state == .finished && core.fireCount != repetitions {
                return "finished after \(core.fireCount) of \(repetitions) runs"
            }
        } else if !rested && state != .running {
            return "did not come to rest"
        }
        return nil
    }
}

/// A thread-safe run counter for handlers under exploration.
final class RunCounter: @unchecked Sendable {
    // Only touched on the exploring thread; Sendable so handlers can capture it.
    private(set) var count = 0
    func increment() { count += 1 }
}

protocol RepeatingTimerExplorationConfiguration {
    static var configuration: RepeatingTimerStateMachine.Configuration { get }
}

enum ForeverCoalescing: RepeatingTimerExplorationConfiguration {
    static let configuration = RepeatingTimerStateMachine.Configuration(
        interval: 10_000_000, repetitions: nil, firesImmediately: false, missedTicks: .coalesce)
}

enum TwiceImmediately: RepeatingTimerExplorationConfiguration {
    static let configuration = RepeatingTimerStateMachine.Configuration(
        interval: 10_000_000, repetitions: 2, firesImmediately: true, missedTicks: .catchUp(limit: 3))
}

enum OnceSkipping: RepeatingTimerExplorationConfiguration {
    static let configuration = RepeatingTimerStateMachine.Configuration(
        interval: 10_000_000, repetitions: 1, firesImmediately: false, missedTicks: .skip)
}
