import Foundation
import Testing

/// Stalls inside async code, in the `stall-probe` helper (`async-chain`): a
/// chain of awaits asyncRoute → asyncMiddleware → asyncLevel × depth →
/// asyncHandler → asyncChainBlocker, each level first awaiting
/// `Task.yield()`, so that each runs as a resumed partial function. The report
/// must show every level the code wrote, in order, the awaiting ones marked,
/// up to the task's entry closure; and so must every profile sample. CI runs
/// it against the release build too (`STALL_PROBE`). No retry: a report that
/// misses a level is a wrong report.
extension StallDetectorIntegrationTests {
    @Suite("Async call stacks (stall-probe, real time)")
    struct AsyncCallStacks {
        /// The frames the report must show from the blocker on: a name prefix,
        /// and whether the frame is an awaiting caller.
        static func expected(target: String, depth: Int) -> [(String, Bool)] {
            var frames: [(String, Bool)] = [("asyncChainBlocker(", false)]
            let hops = ["actors", "samehop"].contains(target)
            if target == "actors" { frames.append(("ChainActor.blockingHandler()", false)) }
            if target == "samehop" { frames.append(("ChainActor.blockingAtOnce()", false)) }
            frames.append(("asyncHandler(", hops))
            frames += Array(repeating: ("asyncLevel(", true), count: depth)
            frames += [("asyncMiddleware(", true), ("asyncRoute(", true)]
            if !["pool", "main", "nested"].contains(target) { frames.append(("ChainActor.run(", true)) }
            // The task's entry: `async let` makes an implicit closure of its expression.
            frames.append((target == "asynclet" ? "implicit closure #" : "closure #", true))
            return frames
        }

        /// The task a report must name, then its parents (`ASYNCTASK` lines of
        /// `stall-probe`): every scenario runs its chain in a task named
        /// "request 42", or in an unnamed child task of it.
        static func expectedTasks(target: String) -> String {
            let request = "\"request 42\" top-level task"
            switch target {
            case "group": return "unnamed child task of a task group ← " + request
            case "asynclet": return "unnamed async let child task ← " + request
            case "nested": return "\"inner\" top-level task"
            default: return request
            }
        }

        /// Whether the outer task of `nested` (whose job ran the chain's task
        /// inside it) shows its own awaiting callers after its handler.
        static func outerChainShown(_ frames: [String]) -> Bool {
            guard let handler = frames.firstIndex(where: { $0.hasPrefix("nestedOuterHandler(") }) else { return false }
            let callers = frames.dropFirst(handler + 1).prefix(3)
            let expected = ["nestedOuterRoute(", "ChainActor.runNested(", "closure #"]
            return callers.count == 3
                && zip(callers, expected).allSatisfy { $0.hasPrefix($1) && $0.hasSuffix(" [await]") }
        }

        /// The frames from the blocker on that differ from `expected`, as text
        /// (empty when they match).
        static func mismatch(_ frames: [String], _ expected: [(String, Bool)]) -> String {
            guard let start = frames.firstIndex(where: { $0.hasPrefix("asyncChainBlocker(") }) else {
                return "no asyncChainBlocker frame in \(frames)"
            }
            let shown = Array(frames[start...])
            for (index, (prefix, awaiting)) in expected.enumerated() {
                guard index < shown.count else { return "only \(shown.count) frames from the blocker: \(shown)" }
                let frame = shown[index]
                if !frame.hasPrefix(prefix) || frame.hasSuffix(" [await]") != awaiting {
                    return
                        "frame \(index) from the blocker is \(frame), expected \(prefix)…\(awaiting ? " [await]" : "")"
                }
            }
            return ""
        }

        static func frames(_ line: String, dropping fields: Int) -> [String] {
            line.split(separator: " ", maxSplits: fields).last.map {
                $0.split(separator: "|").map(String.init)
            } ?? []
        }

        @Test(
            "a stall at the end of a chain of awaits names every awaiting caller, in order, to the task's entry",
            arguments: ["queue", "custom", "actors", "group", "asynclet", "main", "nested", "samehop", "pool"])
        func everyTarget(target: String) throws {
            var run = try ProbeRun.run(["async-chain", target, "2"], timeLimit: 60, traced: true)
            // A detector whose threads got no core until the stall had ended
            // reports it late (its profile then covers the time after the
            // report only, or nothing) and says why: the machine missed the
            // time bound, and the run is tried once more. (`pool` beside busy
            // processes and parallel stall-probe runs: 3 runs in 16 took 360 ms
            // to look at every thread, at about a sixth of a core.)
            if Self.reportedAfterTheEnd(run) {
                // What the late run did show must still be right.
                for line in run.lines where line.hasPrefix("ASYNC ") && line.contains("asyncChainBlocker(") {
                    let problem = Self.mismatch(Self.frames(line, dropping: 2), Self.expected(target: target, depth: 2))
                    #expect(problem.isEmpty, "late run, \(line.prefix(20)): \(problem)")
                }
                run = try ProbeRun.run(["async-chain", target, "2"], timeLimit: 60, traced: true)
            }
            #expect(run.exitStatus == 0, "\(run.lines.suffix(5))")
            let expected = Self.expected(target: target, depth: 2)
            let reports = run.lines.filter { $0.hasPrefix("ASYNC ") }
            #expect(reports.count == 2, "\(run.lines)")
            for line in reports {
                let problem = Self.mismatch(Self.frames(line, dropping: 2), expected)
                #expect(problem.isEmpty, "\(line.prefix(20)): \(problem)")
                if target == "nested" { #expect(Self.outerChainShown(Self.frames(line, dropping: 2)), "\(line)") }
            }
            // A job run inside another (of the same task or not) cuts no chain
            // for want of a context: the frames below the inner job's runner are
            // read right. (A thread that moved on at the stall's end rightly cuts
            // one sample's chain: counted above.)
            if ["nested", "samehop"].contains(target) {
                let falseCuts = ["is not code", "is not aligned", "could not be read"]
                for text in run.started.map(\.report) + run.ended.map(\.report) + run.lines {
                    #expect(!falseCuts.contains { text.contains($0) }, "\(text)")
                }
            }
            Self.expectTasks(run, target: target)
            for line in run.lines where line.hasPrefix("ASYNCPOOL started ") {
                let problem = Self.mismatch(Self.frames(line, dropping: 3), expected)
                #expect(problem.isEmpty, "\(line.prefix(24)): \(problem)")
            }
            if target == "pool" { #expect(run.lines.contains { $0.hasPrefix("ASYNCPOOL started ") }) }
            try Self.expectProfileRouted(run)
        }

        /// Both reports name the task that ran the chain, and its parents.
        private static func expectTasks(_ run: ProbeRun, target: String) {
            let tasks = run.lines.filter { $0.hasPrefix("ASYNCTASK ") }
            #expect(tasks.count == 2, "\(run.lines)")
            for line in tasks {
                let shown = line.split(separator: " ", maxSplits: 2).last.map(String.init) ?? ""
                if target == "pool" {
                    // Each pool thread runs a task of its own, "pool request 0", 1, ….
                    #expect(shown.hasPrefix("\"pool request ") && shown.hasSuffix("\" top-level task"), "\(line)")
                } else {
                    #expect(shown == expectedTasks(target: target), "\(line)")
                }
            }
        }

        /// Every profile sample in the blocker passes through the route (samples
        /// taken after the blocker returned, while the awaits return, rightly show
        /// a shorter chain), or says why not.
        private static func expectProfileRouted(_ run: ProbeRun) throws {
            let unrouted = run.lines.filter { $0.hasPrefix("ASYNCUNROUTED ") }
            for line in run.lines where line.hasPrefix("ASYNCPROFILE ended ") {
                let fields = line.split(separator: " ").compactMap { Int($0) }
                try #require(fields.count == 4 && fields[1] > 0, "\(line)")
                // A sample without its awaiting callers says why, in its stack:
                // one that does not passes for a task entered in the handler.
                #expect(fields[2] == fields[3], "a sample lacks its callers and does not say so: \(line) \(unrouted)")
            }
            // Looks whose callers were cut (a profile sample stands for the time
            // until the next look, so one look may count as several samples):
            // the thread left its awaits between the copy and their reading at
            // the stall's end only, in the blocker's last wake-up and while the
            // awaits return. More than that is a defect (a sleeping thread's
            // chain lost to its short wake-ups, say).
            let cutLooks = run.lines.filter { isCutLook($0) }
            #expect(cutLooks.count <= 2, "\(cutLooks.count) looks with callers cut: \(unrouted)")
        }

        @Test(
            "a stall under a synchronous recursion deeper than the sampler copies: its awaits shown or said to be missing"
        )
        func deeperThanTheCopy() throws {
            let missing =
                "awaiting callers not all shown: the async frame lay deeper in the stack than the sampler copies"
            // A report with a stack shows the route or says why not (a late run's too).
            func checkReports(_ run: ProbeRun) {
                for event in run.started + run.ended where event.report.contains("deepStackParse(") {
                    let shown = event.report.contains("deepStackRoute(isolation:) [await]")
                    #expect(shown || event.report.contains(missing), "\(event.report)")
                }
            }
            var run = try ProbeRun.run(["async-chain", "deepstack"], timeLimit: 60)
            if Self.reportedAfterTheEnd(run) {
                checkReports(run)
                run = try ProbeRun.run(["async-chain", "deepstack"], timeLimit: 60)
            }
            #expect(run.exitStatus == 0, "\(run.lines.suffix(5))")
            #expect(run.started.count == 1 && run.ended.count == 1, "\(run.lines.suffix(5))")
            for event in run.started + run.ended {
                #expect(event.report.contains("deepStackParse("), "\(event.report)")
            }
            checkReports(run)
            // Every profile sample in the blocker shows the route or says why not.
            let blocked = run.lines.filter { $0.hasPrefix("ASYNCUNROUTED ") }
            #expect(!blocked.isEmpty)
            for line in blocked {
                #expect(line.contains("deepStackRoute(") || line.contains("<\(missing)>"), "\(line.prefix(300))")
            }
        }

        @Test(
            "a detector per actor (4 per core), every actor stalled at once in a chain: each names its own task and chain"
        )
        func manyDetectors() throws {
            let count = 4 * ProcessInfo.processInfo.activeProcessorCount
            func problems(_ run: ProbeRun) -> (wrong: [String], stackless: Int) {
                let lines = run.lines.filter { $0.hasPrefix("ASYNCMANY ") }
                var wrong = lines.count == 2 * count ? [] : ["\(lines.count) reports of \(2 * count)"]
                var stackless = 0
                for line in lines {
                    let fields = line.split(separator: " ", maxSplits: 5).map(String.init)
                    guard fields.count == 6 else {
                        wrong.append(line)
                        continue
                    }
                    if fields[3] == "nostack" {
                        stackless += 1
                    } else if fields[4] != "1" || fields[5] != "request \(fields[1])" {
                        wrong.append(line)
                    }
                }
                return (wrong, stackless)
            }
            var run = try ProbeRun.run(["async-many", "\(count)"], timeLimit: 60)
            var found = problems(run)
            #expect(found.wrong.isEmpty, "\(found.wrong)")
            // A report without a stack (the detectors' threads got no core) is
            // the machine's: tried once more. One naming another's task or
            // missing a caller fails at once (above).
            if found.stackless > 0 {
                run = try ProbeRun.run(["async-many", "\(count)"], timeLimit: 60)
                found = problems(run)
                #expect(found.wrong.isEmpty && found.stackless == 0, "\(found)")
            }
            #expect(run.exitStatus == 0)
        }

        /// Whether the `.started` report of `run` says it came after the stall
        /// had ended (the detector's threads waited for a core meanwhile).
        static func reportedAfterTheEnd(_ run: ProbeRun) -> Bool {
            run.started.contains {
                $0.report.contains("the target answered before the stall could be reported")
                    || $0.report.contains("(the detector's threads waited for a core")
            }
        }

        /// Whether `line` is a traced look (`stalldetection frames …`) whose
        /// stack holds a marker of awaiting callers cut (its address is the
        /// cut's kind, a number under 16).
        static func isCutLook(_ line: String) -> Bool {
            let fields = line.split(separator: " ")
            guard fields.count > 2, fields[0] == "stalldetection", fields[1] == "frames" else { return false }
            return fields.dropFirst(2).contains {
                UInt($0.trimmingCharacters(in: ["?"]), radix: 16).map { $0 < 16 } ?? false
            }
        }

        /// A run of `stall-probe async-alternate` with `arguments`: its `ALTSTARTED`
        /// and `ALTPROFILE` lines, and the profile's samples in a chain, mixing
        /// both, and with their callers.
        static func alternation(
            _ arguments: [String]
        ) throws -> (run: ProbeRun, started: String, profile: String, inChain: Int, mixed: Int, withCallers: Int) {
            let run = try ProbeRun.run(["async-alternate"] + arguments, timeLimit: 60)
            #expect(run.exitStatus == 0, "\(run.lines.suffix(5))")
            let started = try #require(run.lines.first { $0.hasPrefix("ALTSTARTED ") })
            let profile = try #require(run.lines.first { $0.hasPrefix("ALTPROFILE ") })
            let fields = profile.split(separator: " ").dropFirst().compactMap { Int($0) }
            try #require(fields.count == 3, "\(profile)")
            return (run, started, profile, fields[0], fields[1], fields[2])
        }

        @Test(
            "a task switching at microseconds between two equally deep chains: the report never mixes them, samples seldom"
        )
        func alternatingChains() throws {
            let (run, started, profile, inChain, mixed, withCallers) = try Self.alternation([])
            #expect(started.hasPrefix("ALTSTARTED 0 "), "the report's callers are the other chain's: \(run.started)")
            print("async-alternate: \(inChain) samples in a chain, \(mixed) mixing both, \(withCallers) with callers")
            #expect(inChain >= 20, "\(profile)")
            // An open defect: a running thread that leaves the function and comes
            // back within the read still passes the checks (3 samples in 1,943 of an
            // outside check's release run; 0 in 1,317 here, debug and release, quiet
            // and beside two busy processes). Before the checks, a third of them.
            #expect(mixed * 10 <= inChain, "\(profile)")
            withKnownIssue("a sample read as the thread left and came back mixes the chains", isIntermittent: true) {
                #expect(mixed == 0, "\(profile)")
            }
            #expect(withCallers > 0, "every sample lost its callers: \(profile)")
        }

        @Test(
            "a task switching at microseconds between two paths that end in the same async function: a known limit, recorded"
        )
        func sharedLeafChains() throws {
            // Nothing in the stack tells the paths apart (DetectingHangsAndStalls,
            // "Async code"): an outside check measured 20–55 % of such samples with
            // the other path's callers. Recorded each time, so that a fix shows.
            let (_, started, profile, inChain, mixed, withCallers) = try Self.alternation(["shared"])
            print("async-alternate shared: \(inChain) samples in a path, \(mixed) with the other's callers, \(started)")
            #expect(inChain >= 20, "\(profile)")
            #expect(withCallers > 0, "every sample lost its callers: \(profile)")
            withKnownIssue("a running task switching between two paths to one async function", isIntermittent: true) {
                #expect(mixed == 0 && started.hasPrefix("ALTSTARTED 0 "), "\(profile) \(started)")
            }
        }

        @Test("a queue.sync from a task blocks a pool thread that never answered a probe: the report names the task")
        func syncFromATask() throws {
            // The pool thread's pointer is found on its stack (the descriptor at its
            // top), not from a probe it answered: before, no report named the task.
            let run = try ProbeRun.run(["async-chain", "sync"], timeLimit: 60)
            #expect(run.exitStatus == 0, "\(run.lines.suffix(5))")
            let reports = run.lines.filter { $0.hasPrefix("ASYNC ") }
            #expect(reports.count == 2, "\(run.lines)")
            for line in reports {
                #expect(line.contains("asyncChainBlocker(_:)|") && line.contains("DispatchQueue.sync"), "\(line)")
            }
            let tasks = run.lines.filter { $0.hasPrefix("ASYNCTASK ") }
            #expect(tasks.count == 2, "\(run.lines)")
            for line in tasks {
                #expect(line.hasSuffix(" \"sync caller\" top-level task"), "\(line)")
            }
        }

        @Test("a chain of 200 awaits keeps all 200 levels, in order")
        func deepChain() throws {
            let run = try ProbeRun.run(["async-chain", "deep", "200"], timeLimit: 60)
            #expect(run.exitStatus == 0, "\(run.lines.suffix(5))")
            let started = try #require(run.lines.first { $0.hasPrefix("ASYNC started ") })
            let problem = Self.mismatch(Self.frames(started, dropping: 2), Self.expected(target: "deep", depth: 200))
            #expect(problem.isEmpty, "\(problem)")
            #expect(!(run.started.first?.report.contains("awaiting callers not all shown") ?? true))
        }
    }
}
