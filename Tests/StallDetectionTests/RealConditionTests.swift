import Foundation
import Testing

/// Stalls as users meet them, in child processes (`stall-probe`, real time): a
/// detector's first stall, a detector per queue or event loop all stalled at
/// once, a detector started inside a run-loop pass, a suspended queue. Each
/// scenario is tried up to 3 times where the machine's load can make one run
/// miss a timing (a look, like any thread, can wait for a core); the bounds are
/// the promises', not guesses of machine speed.
@Suite(
    "Real conditions: first stalls, many detectors, run-loop passes (stall-probe, real time)", .serialized,
    .disabled(if: underThreadSanitizer, "real-time rates and bounds do not hold under ThreadSanitizer"))
struct RealConditionTests {
    /// The promised rates for a detector's first stall: samples per second of
    /// stall in a release and a debug build of the helper.
    static var promisedRate: Double { ProbeRun.probeIsRelease ? 80 : 20 }
    /// The sampling budget, as a share of one core.
    static var budget: Double { ProbeRun.probeIsRelease ? 0.03 : 0.04 }

    /// The rate promised for a run: ``promisedRate``, unless the samples this run
    /// took cost more than the budget allows at that rate (their median, from the
    /// trace, over 1.25 × the budget of the interval: a slow or busy host), where
    /// the pace halves the rate by design and 80 % of the half is held.
    static func promised(for run: ProbeRun) -> Double {
        let costs = run.tracedSamples.map { $0.cost - $0.naming }.sorted()
        guard !costs.isEmpty else { return promisedRate }
        let median = costs[costs.count / 2] + 25  // µs, with the overhead the pace charges
        // The longest interval (µs) that keeps the promised rate: 10 ms in
        // release (100 a second), 40 ms in debug (25 a second).
        let interval = ProbeRun.probeIsRelease ? 10_000.0 : 40_000.0
        return median > 1.25 * budget * interval ? 0.8 * 1_000_000 / interval / 2 : promisedRate
    }

    /// `FIRSTSTALL ended <samples> <A> <B> <span ms>`.
    static func firstStall(_ run: ProbeRun) -> (samples: Double, a: Double, b: Double)? {
        guard let line = run.lines.first(where: { $0.hasPrefix("FIRSTSTALL ended ") }) else { return nil }
        let fields = line.split(separator: " ").compactMap { Double($0) }
        return fields.count >= 3 ? (fields[0], fields[1], fields[2]) : nil
    }

    @Test(
        "a detector's first stall (600 ms busy in A, 300 ms asleep in B) is profiled from its start, at the promised rate, within the budget",
        arguments: ["first-stall", "first-stall-main"])
    func firstStall(scenario: String) throws {
        // A sample counts for the time since the sampler's previous look, so the
        // samples over the stall's length are the share of it the profile
        // covers, at the pace's interval (the promised rate, or half of it when
        // samples cost more than the budget allows). The split between A and B
        // is what the profile says happened: checked on every run whose sampler
        // looked at least a third as often as its pace asked (fewer looks: the
        // machine gave the sampler no core, and one wait spans a third of the
        // stall), never tried again. Tried again (5 runs at most) when the
        // coverage or the looks missed: beside busy processes the sampler gets a
        // core only part of the time. (A debug helper takes 19–21 samples on a
        // quiet machine, 18 needed; inside the whole parallel suite three runs
        // in a row took 5, 17 and 16.) A run whose stall has no `.ended` profile
        // fails at once.
        var run = try ProbeRun.run([scenario], traced: true)
        var stall = try #require(Self.firstStall(run), "lost: \(run.lines.filter { !$0.hasPrefix("stalldetection") })")
        var sampled = Self.looked(run, scenario: scenario, stall: stall)
        // The sampler's CPU is not a reason to try again: the bucket bounds it
        // whatever a sample costs (``allowedCPU(_:)``), on any machine.
        for _ in 1..<5 where !sampled || stall.samples / 0.9 < Self.promised(for: run) {
            print(
                "\(scenario): tried again after \(stall) (the rate or the sampler's looks missed; sampling CPU "
                    + "\(Self.samplingCPU(run)) of \(Self.allowedCPU(run)) ms allowed)")
            // A second apart: the parallel suite's load comes in bursts.
            Thread.sleep(forTimeInterval: 1)
            run = try ProbeRun.run([scenario], traced: true)
            stall = try #require(Self.firstStall(run), "lost: \(run.lines.filter { !$0.hasPrefix("stalldetection") })")
            sampled = Self.looked(run, scenario: scenario, stall: stall)
        }
        let promised = Self.promised(for: run)
        #expect(run.exitStatus == 0)
        #expect(
            sampled,
            "the last run's sampler looked too seldom (the machine gave it no core), or B's sleep was cut short")
        let rate = stall.samples / 0.9
        let interval = Self.profileInterval(run) ?? .infinity
        print(
            "\(scenario): \(stall.samples) samples (\(rate) per second, \(promised) promised), "
                + "one every \(interval) ms, A \(stall.a) : B \(stall.b)")
        #expect(rate >= promised, "\(stall.samples) samples over the 0.9 s stall")
        #expect(interval <= 1_000 / promised, "the pace sampled every \(interval) ms")
        // The sampler's CPU, sample by sample: within the bucket's bound.
        let (sampling, allowed) = (Self.samplingCPU(run), Self.allowedCPU(run))
        print("\(scenario): the sampler used \(sampling) ms of CPU over 1 s (\(run.tracedSamples.count) samples)")
        #expect(sampling <= allowed, "\(sampling) ms of sampling CPU, \(allowed) ms allowed")
    }

    /// The sampler's CPU over a traced run's stall, in milliseconds (naming
    /// functions for the first time, once per process, is paid outside the
    /// budget).
    static func samplingCPU(_ run: ProbeRun) -> Double {
        run.tracedSamples.reduce(0) { $0 + max(0, $1.cost - $1.naming) } / 1_000
    }

    /// The bucket's bound over the stall's second: the budget, plus its 2 ms
    /// burst, 25 µs a sample of scheduling overhead charged with it, and the
    /// costliest sample (the bucket can be overdrawn by one sample, whose cost is
    /// known only once it is taken: beside busy processes one run in about 15
    /// took 76 ms where the others took 18–33).
    static func allowedCPU(_ run: ProbeRun) -> Double {
        let costliest = run.tracedSamples.map { max(0, $0.cost - $0.naming) }.max() ?? 0
        return budget * 1_000 + 2 + Double(run.tracedSamples.count) * 0.025 + costliest / 1_000
    }

    /// The pace's interval (milliseconds) in the `.ended` profile:
    /// `PROFILE <id> ended <samples> <interval ms> <span ms>`.
    static func profileInterval(_ run: ProbeRun) -> Double? {
        guard let line = run.lines.first(where: { $0.hasPrefix("PROFILE ") && $0.contains(" ended ") }) else {
            return nil
        }
        let fields = line.split(separator: " ")
        return fields.count >= 5 ? Double(fields[4]) : nil
    }

    /// Whether the sampler looked at least a third as often as its pace asked
    /// over the 0.9 s stall (the looks are the machine's speed: printed); if it
    /// did, the profile's split is checked (``expectSplit(_:scenario:)``).
    /// A run whose B sleep returned early is not judged either: a look's signal
    /// reached the thread in the microseconds it took to fall asleep, and its
    /// `usleep` returned at once with `EINTR`, as under any signal-based profiler
    /// (documented in HowStallReportsAreMade; `sleepsCutShort` in
    /// SamplerEdgeCaseTests bounds how often). The stall staged did not happen, and
    /// the profile, which shows no B, says what did.
    static func looked(_ run: ProbeRun, scenario: String, stall: (samples: Double, a: Double, b: Double)) -> Bool {
        let looks = run.tracedSamples.filter(\.kept).count
        let needed = 900 / (profileInterval(run) ?? 10) / 3
        let unkept = run.tracedSamples.count - looks
        print(
            "\(scenario): \(looks) looks (\(needed) needed to judge the split; \(unkept) found no stack), "
                + "A \(stall.a) : B \(stall.b), stall \(run.realMilliseconds) ms, B asleep \(run.sleeps)")
        if run.sleepCutShort(staged: [300]) {
            print("\(scenario): B's usleep was cut short by a look: \(run.sleeps)")
            return false
        }
        guard Double(looks) >= needed else { return false }
        expectSplit(stall, scenario: scenario)
        return true
    }

    /// The profile's split of a first stall: 600 ms busy in A, then 300 ms
    /// asleep in B, so 2 : 1 (within a quarter) from a release helper, and more A
    /// than B from a debug one (fewer samples).
    static func expectSplit(_ stall: (samples: Double, a: Double, b: Double), scenario: String) {
        #expect(stall.b >= 1, "\(scenario): the asleep phase is in the profile")
        if ProbeRun.probeIsRelease {
            let ratio = stall.a / max(1, stall.b)
            #expect(ratio >= 1.5 && ratio <= 2.5, "\(scenario): A \(stall.a) : B \(stall.b)")
        } else {
            #expect(stall.a > stall.b, "\(scenario): A \(stall.a) : B \(stall.b)")
        }
    }

    /// `DETECTOR <index> <phase> <received ms> <duration ms> <depth> …` and
    /// `BLOCKED <index> <begin ms> <end ms>` lines.
    struct ManyDetectors {
        /// `starting`: the report shows the queue's own block as it began (the
        /// queue had waited for a thread, 8 spinning blocks on 2 cores), before
        /// its blocker: this target's job, so right.
        var right = 0, starting = 0, wrong = 0, unavailable = 0, lost = 0, late = 0
        /// Of `unavailable`: reports the detector decided on only after the stall
        /// had ended (the stall's begin plus the duration `.started` gives is at
        /// or after its end: the detector's threads got no CPU while it lasted),
        /// when no thread is stuck any more and there is no stack to take. A
        /// report decided while the stall lasted has no such excuse, however
        /// late it was delivered.
        var lateUnavailable = 0
        /// `.ended` events shorter than their `.started` (an answer recorded
        /// after a look that read a later time: a stall the target had already
        /// ended when it was reported).
        var shortEnded = 0

        /// Whether every detector named its own target's function, or, when it
        /// was late, had no stack because the stall had ended: nothing wrong,
        /// lost or stackless while the stall lasted.
        func onlyLate(count: Int) -> Bool {
            wrong == 0 && lost == 0 && shortEnded == 0 && unavailable == lateUnavailable
                && right + lateUnavailable == count
        }

        init() {}

        /// Adds another run's counts to these.
        mutating func add(_ other: ManyDetectors) {
            (right, starting, wrong) = (right + other.right, starting + other.starting, wrong + other.wrong)
            (unavailable, lost, late) = (unavailable + other.unavailable, lost + other.lost, late + other.late)
            lateUnavailable += other.lateUnavailable
            shortEnded += other.shortEnded
        }

        init(_ run: ProbeRun, count: Int) {
            var blocked: [Int: (begin: Double, end: Double)] = [:]
            var started: [Int: (received: Double, duration: Double, depth: Int)] = [:]
            var ended: [Int: Double] = [:]
            for line in run.lines {
                let fields = line.split(separator: " ")
                if fields.first == "BLOCKED", fields.count >= 4, let index = Int(fields[1]),
                    let begin = Double(fields[2]), let end = Double(fields[3])
                {
                    blocked[index] = (begin, end)
                } else if fields.first == "DETECTOR", fields.count >= 6, fields[2] == "started",
                    let index = Int(fields[1]), let received = Double(fields[3]), let duration = Double(fields[4]),
                    let depth = Int(fields[5])
                {
                    started[index] = (received, duration, depth)
                } else if fields.first == "DETECTOR", fields.count >= 5, fields[2] == "ended",
                    let index = Int(fields[1]), let duration = Double(fields[4])
                {
                    ended[index] = duration
                }
            }
            for index in 0..<count {
                guard let event = started[index] else {
                    lost += 1
                    continue
                }
                if let duration = ended[index], duration < event.duration { shortEnded += 1 }
                if event.depth == index + 1 {
                    right += 1
                } else if event.depth == -2 {
                    (right, starting) = (right + 1, starting + 1)
                } else if event.depth < 0 {
                    unavailable += 1
                } else {
                    wrong += 1
                }
                if let stall = blocked[index], event.received > stall.end {
                    late += 1
                    if event.depth == -1 && stall.begin + event.duration >= stall.end { lateUnavailable += 1 }
                }
            }
        }
    }

    @Test(
        "a detector per queue or event loop (4 per core), all stalled at once: each reports its own target's function, while the stall lasts",
        arguments: ["many-queues", "many-loops"])
    func manyDetectors(scenario: String) throws {
        let count = 4 * ProcessInfo.processInfo.activeProcessorCount
        var run = try ProbeRun.run([scenario, "\(count)"])
        var result = ManyDetectors(run, count: count)
        // Tried again (3 runs at most) only when every detector named its own
        // target's function or was late with no stack to take (its stall had
        // ended): beside two busy processes, and beside the rest of the suite,
        // the detectors' own threads wait for a core too, a bound the machine
        // can miss (each late event says why). A wrong or lost report, or one
        // without a stack while its stall lasted, fails at once
        // (`ReportRateTests` counts them over 200 runs).
        for _ in 1..<3 where result.late > 0 && result.onlyLate(count: count) {
            print("\(scenario) \(count), tried again after: \(result) \(run.lines.filter { $0.hasPrefix("LATE") })")
            run = try ProbeRun.run([scenario, "\(count)"])
            result = ManyDetectors(run, count: count)
        }
        let details = run.lines.filter { $0.hasPrefix("DETAIL") || $0.hasPrefix("LATE") }
        print("\(scenario) \(count): \(result)")
        #expect(result.lost == 0, "\(result) \(details)")
        #expect(result.wrong == 0, "a detector blamed another target: \(result) \(details)")
        #expect(result.shortEnded == 0, "an .ended shorter than its .started: \(result) \(run.lines)")
        #expect(result.late == 0, "a .started came after its stall ended: \(result) \(details)")
        #expect(result.right == count, "\(result) \(details)")
    }

    @Test("a stall in a function recursed 3 deep: every sample of its profile shows the 3 frames")
    func recursionDepthInEverySample() throws {
        // One detector per event loop tells its target's blocker from its
        // neighbours' by this depth: a sample that loses a recursive frame reads
        // as another loop's stall (a 200-run rate of 8 event loops beside two busy
        // processes, release: 1 of 1,600 reports). Known open defect: 2 of 294
        // samples showed 2 frames in one of about 160 release runs; printed,
        // never retried. A sample without the function (0 frames) is the job's
        // first or last microseconds (its block called or released, or the
        // probe that ends the stall): at most 2. More than 3 frames is a phantom.
        let run = try ProbeRun.run(["recursion-depth", "3000"])
        #expect(run.exitStatus == 0)
        let line = run.lines.first { $0.hasPrefix("DEPTHS ") } ?? ""
        var depths: [Int: Int] = [:]
        for field in line.split(separator: " ").dropFirst() {
            let parts = field.split(separator: ":").compactMap { Int($0) }
            if parts.count == 2 { depths[parts[0]] = parts[1] }
        }
        let odd = run.lines.filter { $0.hasPrefix("ODD ") }
        print("recursion-depth: \(line) \(odd)")
        #expect((depths[3] ?? 0) >= 30, "\(run.lines.suffix(5))")
        #expect((depths[0] ?? 0) <= 2, "samples outside the function: \(odd)")
        #expect(!depths.keys.contains { $0 > 3 }, "a phantom recursive frame: \(odd)")
        withKnownIssue("a sample lost a recursive frame", isIntermittent: true) {
            #expect(depths[1] == nil && depths[2] == nil, "\(odd)")
        }
    }

    @Test("50 stalls just over the threshold (275 ms at 250 ms), beside two busy processes: each reported once")
    func stallsJustOverTheThreshold() throws {
        let run = try ProbeRun.withBurners(2) { try ProbeRun.run(["short-stalls", "275"], timeLimit: 90) }
        #expect(run.exitStatus == 0)
        let ids = Set(run.started.map(\.id))
        print("short stalls beside two busy processes: \(run.started.count) of 50 reported, \(run.ended.count) ended")
        #expect(run.started.count == 50, "\(run.started.count) of 50 reported")
        #expect(ids.count == run.started.count, "each once")
        #expect(run.ended.count == run.started.count)
    }

    @Test(
        "an idle event loop at nice 19 whose probes wait up to 0.7 s for a core beside spinning threads: no stall; its own 700 ms job: one each time"
    )
    func idleLoopWaitingForACore() throws {
        // Before its thread's wait for a core was weighed, each run reported 4 or 5
        // stalls without a stack for 3 such spells (the process ran, so a late
        // answer passed as evidence). Never tried again: a false stall fails.
        let run = try ProbeRun.run(["starved-loop", "3"], timeLimit: 60)
        #expect(run.exitStatus == 0 && run.lines.contains("DONE"), "\(run.lines.suffix(5))")
        let waited = run.lines.first { $0.hasPrefix("LOOPWAIT ") }.flatMap { Double($0.dropFirst(9)) } ?? 0
        print("starved loop: probes waited up to \(Int(waited)) ms for a core; \(run.started.count) stalls reported")
        let falseStalls = run.started.filter { !$0.report.contains("starvedLoopJob") }
        #expect(falseStalls.isEmpty, "stalls while the loop only waited for a core: \(falseStalls.map(\.report))")
        #expect(run.started.count == 3 && run.ended.count == 3, "one per job: \(run.started.map(\.report))")
    }

    @Test("a main-run-loop detector started inside a run-loop pass reports a stall in that same pass")
    func startedInsideARunLoopPass() throws {
        let named = { (run: ProbeRun) in run.started.first?.report.contains("uniquelyNamedMainThreadBlocker") == true }
        // No retry: a report of the pass that does not name its blocker is wrong.
        let run = try ProbeRun.run(["runloop-start-pass", "600"])
        #expect(run.exitStatus == 0)
        #expect(run.started.count == 1, "\(run.lines)")
        #expect(named(run), "\(run.started.first?.report ?? "")")
        #expect(run.ended.count == 1)
    }

    @Test(
        "in a process with 256 or 1,000 idle threads, every stall of a queue has its stack and a profile, whichever thread ran it",
        arguments: [256, 1_000])
    func crowdedProcess(threads: Int) throws {
        // No retry: a stall reported without its stack is a lost report, whatever
        // the machine's load.
        let run = try ProbeRun.run(["crowded", "\(threads)"], timeLimit: 90)
        #expect(run.exitStatus == 0, "\(run.lines.suffix(5))")
        let lines = run.lines.filter { $0.hasPrefix("CROWDED ") }.map { $0.split(separator: " ").map(String.init) }
        let started = lines.filter { $0.count >= 6 && $0[2] == "started" }
        let ended = lines.filter { $0.count >= 6 && $0[2] == "ended" }
        #expect(started.count == 8 && ended.count == 8, "\(lines)")
        for event in started + ended {
            #expect(event[3] == "1", "stall \(event[1]) \(event[2]) lost its stack: \(event[5])")
        }
        // Each stall has a profile: at least one sample of the thread that ran it
        // (a search over every thread per sample used to take none). How many is a
        // rate, which a loaded machine lowers: printed, not asserted.
        for event in ended {
            #expect((Int(event[4]) ?? 0) >= 1, "stall \(event[1]): \(event[4]) samples")
        }
        print("crowded \(threads): samples per stall \(ended.map { $0[4] })")
    }

    @Test("a suspended queue is reported as stalled, with why no stack, never another queue's thread")
    func suspendedQueue() throws {
        let run = try ProbeRun.run(["suspended-queue", "800"])
        #expect(run.exitStatus == 0)
        let started = try #require(run.started.first, "\(run.lines)")
        #expect(started.report.contains("no thread was seen running this queue's job"), "\(started.report)")
        #expect(!started.report.contains("uniquelyNamedMainThreadBlocker"), "\(started.report)")
        #expect(run.ended.first.map { !$0.report.contains("uniquelyNamedMainThreadBlocker") } == true)
    }
}
