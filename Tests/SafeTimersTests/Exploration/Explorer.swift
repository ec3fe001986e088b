/// A small model checker for the primitives: it drives a system through every
/// sequence of steps up to a depth (depth-first, each path replayed from a fresh
/// system), checks invariants after every step and liveness at the end of each
/// path, and returns the first counterexample as the list of its steps.
///
/// Systems are built on real primitives over a `ManualTimerScheduler` with a
/// recording executor (see ``PrimitiveWorld``), so a path is deterministic and a
/// replay reproduces it exactly.
protocol ExplorableSystem {
    associatedtype Step: CustomStringConvertible
    init()
    /// The steps that can happen next.
    func enabledSteps() -> [Step]
    /// Performs one step.
    mutating func perform(_ step: Step)
    /// An invariant broken by the last step, if any.
    var violation: String? { get }
    /// Ends a path: lets time run with no more user calls until nothing is left
    /// to do, then checks what must hold at rest (liveness). Returns a violation.
    mutating func finish() -> String?
}

struct ExplorationReport: CustomStringConvertible {
    /// Steps performed (nodes of the tree, counting replays once).
    var states = 0
    /// Complete paths checked.
    var paths = 0
    /// The first path that broke an invariant, with what broke.
    var counterexample: (steps: [String], violation: String)?

    var description: String {
        var text = "\(states) states, \(paths) paths"
        if let counterexample {
            text += "; counterexample after \(counterexample.steps.count) steps: "
            text += counterexample.steps.joined(separator: " → ") + " ⇒ " + counterexample.violation
        }
        return text
    }
}

enum Explorer {
    /// Every sequence of up to `depth` steps.
    static func exhaustive<System: ExplorableSystem>(_ system: System.Type, depth: Int) -> ExplorationReport {
        var report = ExplorationReport()
        var path: [Int] = []
        explore(System.self, path: &path, depth: depth, report: &report)
        return report
    }

    private static func replay<System: ExplorableSystem>(
        _: System.Type, _ path: [Int], report: inout ExplorationReport
    ) -> (System, [String], String?) {
        var system = System()
        var names: [String] = []
        for choice in path {
            let step = system.enabledSteps()[choice]
            names.append(step.description)
            system.perform(step)
            if let violation = system.violation { return (system, names, violation) }
        }
        return (system, names, nil)
    }

    private static func explore<System: ExplorableSystem>(
        _: System.Type, path: inout [Int], depth: Int, report: inout ExplorationReport
    ) {
        guard report.counterexample == nil else { return }
        var (system, names, violation) = replay(System.self, path, report: &report)
        report.states += 1
        if let violation {
            report.counterexample = (names, violation)
            return
        }
        let steps = system.enabledSteps()
        if path.count == depth || steps.isEmpty {
            report.paths += 1
            if let violation = system.finish() { report.counterexample = (names + ["(run to rest)"], violation) }
            return
        }
        for choice in steps.indices {
            path.append(choice)
            explore(System.self, path: &path, depth: depth, report: &report)
            path.removeLast()
            if report.counterexample != nil { return }
        }
    }

    /// `runs` random paths of `depth` steps, seeded: deeper than the exhaustive
    /// search reaches, and reproducible.
    static func random<System: ExplorableSystem>(
        _: System.Type, runs: Int, depth: Int, seed: UInt64
    ) -> ExplorationReport {
        var report = ExplorationReport()
        var generator = SplitMix64(seed: seed)
        for _ in 0..<runs {
            var system = System()
            var names: [String] = []
            for _ in 0..<depth {
                let steps = system.enabledSteps()
                guard !steps.isEmpty else { break }
                let step = steps[Int(generator.next() % UInt64(steps.count))]
                names.append(step.description)
                system.perform(step)
                report.states += 1
                if let violation = system.violation {
                    report.counterexample = (names, violation)
                    return report
                }
            }
            report.paths += 1
            if let violation = system.finish() {
                report.counterexample = (names + ["(run to rest)"], violation)
                return report
            }
        }
        return report
    }
}
