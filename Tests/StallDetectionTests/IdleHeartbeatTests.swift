import Dispatch
import Foundation
import Testing

@testable import StallDetection

/// `idleHeartbeat`: probes spaced wider while the target answers promptly, back
/// to every beat at the first late answer; what a stall that begins in a wide
/// gap is reported as; the values the detector takes.
@Suite("Idle heartbeat")
struct IdleHeartbeatTests {
    static let ms: Int64 = 1_000_000
    let ms = Self.ms
    let threshold = 250 * Self.ms
    let heartbeat = 25 * Self.ms

    // MARK: The spacing alone

    @Test("the spacing doubles after four prompt answers in a row, up to the widest, and narrows at once")
    func spacingWidensAndNarrows() {
        var spacing = ProbeSpacing(widest: 3)
        let prompt = heartbeat / 4
        for _ in 0..<3 { spacing.answered(lag: prompt, heartbeat: heartbeat) }
        #expect(spacing.beats == 1, "three prompt answers are not enough")
        spacing.answered(lag: prompt, heartbeat: heartbeat)
        #expect(spacing.beats == 2)
        spacing.answered(lag: nil, heartbeat: heartbeat)
        #expect(spacing.beats == 2, "nothing owed: neither wider nor narrower")
        for _ in 0..<4 { spacing.answered(lag: 0, heartbeat: heartbeat) }
        #expect(spacing.beats == 3, "capped at the widest")
        for _ in 0..<8 { spacing.answered(lag: 0, heartbeat: heartbeat) }
        #expect(spacing.beats == 3)
        spacing.answered(lag: prompt + 1, heartbeat: heartbeat)
        #expect(spacing.beats == 1, "one answer past a quarter heartbeat narrows it")
        for _ in 0..<3 { spacing.answered(lag: 0, heartbeat: heartbeat) }
        spacing.narrow()
        spacing.answered(lag: 0, heartbeat: heartbeat)
        #expect(spacing.beats == 1, "a narrowing also restarts the count of prompt answers")

        var fixed = ProbeSpacing(widest: 0)
        for _ in 0..<20 { fixed.answered(lag: 0, heartbeat: heartbeat) }
        #expect(fixed.widest == 1 && fixed.beats == 1, "no idle heartbeat: every beat")
    }

    // MARK: The machine, in virtual time

    @Test("an idle target's probes: every beat four times, every second beat four times, then every fourth")
    func idleTargetIsProbedLessOften() {
        var drive = Drive(threshold: threshold, heartbeat: heartbeat, widestSpacing: 4)
        drive.run(until: 1_000 * ms)
        let expected: [Int64] = [25, 50, 75, 100, 150, 200, 250, 300, 400, 500, 600, 700, 800, 900, 1_000]
        #expect(drive.posts == expected.map { $0 * ms })
        #expect(drive.lags.allSatisfy { $0 == Drive.answerDelay }, "each lag from the point its probe was owed")

        var plain = Drive(threshold: threshold, heartbeat: heartbeat, widestSpacing: 1)
        plain.run(until: 1_000 * ms)
        #expect(plain.posts.count == 40, "without an idle heartbeat, a probe every beat")
    }

    @Test("a block of threshold + idle heartbeat begun right after a wide gap's probe: reported, measured short")
    func blockInAWideGapIsReported() throws {
        var drive = Drive(threshold: threshold, heartbeat: heartbeat, widestSpacing: 4)
        // The probe of 400 ms answers at 400.3 ms; the next is owed at 500 ms.
        drive.block = 401 * ms..<(401 + 350) * ms
        drive.run(until: 1_200 * ms)
        let started = try #require(drive.started.first, "no .started")
        #expect(drive.started.count == 1 && drive.ended.count == 1 && drive.missed.isEmpty)
        // Counted from half a heartbeat before the probe that found it (487.5 ms).
        #expect(started.at == 737_500_000, "the look due a threshold after 487.5 ms")
        let ended = try #require(drive.ended.first)
        #expect(ended == 751 * ms + Drive.answerDelay - 487_500_000, "263.8 ms of the 350 ms block")
        // Back to a probe every beat after the stall.
        let after = drive.posts.filter { $0 > 751 * ms }
        #expect(Array(after.prefix(4)) == [775, 800, 825, 850].map { $0 * ms })
    }

    @Test("a block under threshold − heartbeat found by a wide gap's probe: never reported")
    func shortBlockInAWideGapIsNotReported() {
        // The probe of 400 ms answers at 400.3 ms; the next is owed at 500 ms. A
        // block from 480 ms holds it until the block ends: counted from 487.5 ms
        // (half a heartbeat before the probe), 224 ms ends 216.8 ms later, no
        // stall. Counted from the middle of the gap (450.15 ms), it would be a
        // 254 ms stall.
        for length: Int64 in [200, 224] {
            var drive = Drive(threshold: threshold, heartbeat: heartbeat, widestSpacing: 4)
            drive.block = 480 * ms..<(480 + length) * ms
            drive.run(until: 1_200 * ms)
            #expect(drive.started.isEmpty && drive.missed.isEmpty, "a \(length) ms block reported")
        }
    }

    @Test("an answer that is not prompt brings the probes back to every beat")
    func lateAnswerNarrows() {
        var drive = Drive(threshold: threshold, heartbeat: heartbeat, widestSpacing: 4)
        // The 500 ms probe waits 10 ms (a short block): more than a quarter heartbeat.
        drive.block = 495 * ms..<510 * ms
        drive.run(until: 700 * ms)
        let after = drive.posts.filter { $0 >= 500 * ms }
        #expect(Array(after.prefix(5)) == [500, 525, 550, 575, 600].map { $0 * ms })
        #expect(drive.started.isEmpty && drive.missed.isEmpty)
    }

    // MARK: The values a detector takes

    @Test(
        "idleHeartbeat is rounded down to whole heartbeats, at least the heartbeat and at most half the threshold",
        arguments: [
            (nil, 25), (-5, 25), (0, 25), (10, 25), (25, 25), (60, 50), (100, 100), (124, 100), (125, 125),
            (10_000, 125),
        ] as [(Int64?, Int64)])
    func valuesTaken(given: Int64?, expected: Int64) {
        let detector = StallDetector(
            target: .queue(DispatchQueue(label: "idle.values")), threshold: .milliseconds(250),
            heartbeat: .milliseconds(25), idleHeartbeat: given.map { .milliseconds($0) })
        #expect(detector.idleHeartbeat == .milliseconds(expected))
        #expect(detector.heartbeat == .milliseconds(25))
    }

    @Test("a heartbeat of half the threshold or more, or the main run loop: no wider spacing")
    func noRoomToWiden() {
        let wide = StallDetector(
            target: .queue(DispatchQueue(label: "idle.wide")), threshold: .milliseconds(100),
            heartbeat: .milliseconds(60), idleHeartbeat: .seconds(1))
        #expect(wide.idleHeartbeat == .milliseconds(60))
        let runLoop = StallDetector(target: .mainRunLoop, idleHeartbeat: .milliseconds(100))
        #expect(runLoop.idleHeartbeat == runLoop.heartbeat)
    }

    // MARK: A real detector

    @Test("an idle queue's detector with idleHeartbeat posts a fraction of the probes, and still reports a stall")
    func realDetectorProbesLessAndReports() throws {
        let queue = DispatchQueue(label: "idle.real")
        let events = Locked<[StallEvent]>([])
        let detector = StallDetector(
            target: .queue(queue), threshold: .milliseconds(250), heartbeat: .milliseconds(25),
            idleHeartbeat: .milliseconds(100)
        ) { event in events.withLock { $0.append(event) } }
        detector.start()
        defer { detector.stop() }
        Thread.sleep(forTimeInterval: 2)
        let lag = detector.lagSnapshot(reset: true)
        // Every beat: 80 probes in 2 s. Spaced: 8 while widening, then one in
        // 100 ms, about 25. Answers later than a quarter heartbeat (a loaded
        // machine) narrow it, as they should: the count is held to what the
        // lags allow.
        if lag.max <= .microseconds(6_250) {
            #expect(lag.count < 40, "every answer prompt, yet \(lag.count) probes in 2 s")
        } else if lag.p90 <= .microseconds(6_250) {
            #expect(lag.count < 70, "nine answers in ten prompt, yet \(lag.count) probes in 2 s")
        } else {
            print("IdleHeartbeatTests: answers came late on this machine (\(lag)); count not checked")
        }
        // A block of threshold + idleHeartbeat with a margin: reported, with its end.
        queue.async { usleep(600_000) }
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline, !events.withLock({ $0.contains { $0.phase == .ended } }) {
            Thread.sleep(forTimeInterval: 0.05)
        }
        detector.waitForHandler()
        let seen = events.withLock { $0 }
        let started = seen.filter { $0.phase == .started }
        let ended = seen.filter { $0.phase == .ended }
        #expect(started.count == 1 && ended.count == 1, "\(seen.map(\.phase))")
        if let duration = ended.first?.duration {
            // Its start is known within half a heartbeat, as without idleHeartbeat.
            #expect(duration <= .milliseconds(615), "longer than the block by over half a heartbeat: \(duration)")
            #expect(duration >= .milliseconds(250), "\(duration)")
        }
    }
}

/// A detector's machine driven in virtual time with a target that answers each
/// probe `answerDelay` after it is posted, unless blocked in `block` (then at
/// its end); beats on the grid, looks when armed, samples that confirm at once.
private struct Drive {
    static let answerDelay: Int64 = 300_000
    let heartbeat: Int64
    var machine: DetectorMachine
    var block: Range<Int64> = 0..<0
    var now: Int64 = 0
    var nextBeat: Int64
    var answerAt: Int64?
    var lookAt: Int64?
    var posts: [Int64] = []
    var lags: [Int64] = []
    var started: [(id: UInt64, at: Int64)] = []
    var ended: [Int64] = []
    var missed: [Int64] = []

    init(threshold: Int64, heartbeat: Int64, widestSpacing: Int64) {
        self.heartbeat = heartbeat
        machine = DetectorMachine(
            threshold: threshold, heartbeat: heartbeat, usesHeartbeat: true, now: 0, widestSpacing: widestSpacing)
        _ = machine.begin()
        _ = machine.watch(from: 0, inRunLoopPass: false, gridStart: 0)
        nextBeat = heartbeat
    }

    mutating func run(until end: Int64) {
        while let next = [answerAt, lookAt, nextBeat].compactMap({ $0 }).min(), next <= end {
            now = next
            if answerAt == now {
                answer()
            } else if lookAt == now {
                look()
            } else {
                beat()
            }
        }
    }

    private mutating func beat() {
        nextBeat = now + heartbeat
        let planned = machine.beatHandingOver(at: now, next: nextBeat, cpu: nil, lookArmed: lookAt != nil)
        guard let plan = planned else { return }
        if plan.post {
            posts.append(now)
            answerAt = block.contains(now) ? block.upperBound + Self.answerDelay : now + Self.answerDelay
        }
        apply(plan.look)
    }

    private mutating func answer() {
        answerAt = nil
        defer { machine.releaseProbeSlot() }
        guard let step = machine.answered(at: now, thread: 7, queue: 1) else { return }
        if let lag = step.lag { lags.append(lag) }
        switch step.outcome {
        case .ended(_, let duration, _, _): ended.append(duration)
        case .missed(_, let duration, _, _, _): missed.append(duration)
        case nil: break
        }
        apply(step.look)
    }

    private mutating func look() {
        lookAt = nil
        let (look, plan) = machine.look(now: now, continued: nil)
        apply(plan)
        guard case .sample(let decision) = look else { return }
        let sample = StallBacktrace(frames: [], threadID: 7, unavailableReason: nil)
        let (report, _, _) = machine.sampled(
            decision, reported: sample, samples: [7: sample], samplingTime: 0, confirmed: true, suppressed: false)
        if case .events = report { started.append((decision.id, now)) }
    }

    private mutating func apply(_ plan: DetectorMachine.LookPlan) {
        switch plan {
        case .keep: break
        case .drop: lookAt = nil
        case .move(let timeout), .arm(let timeout): lookAt = now + timeout
        }
    }
}

/// Many detectors with an idle heartbeat at once, as a server runs one per event
/// loop: each reports its own target's block, once, measured within the promise.
@Suite("Idle heartbeat, many detectors")
struct IdleHeartbeatManyTests {
    @Test("8 detectors with idleHeartbeat, 8 queues blocked 600 ms one after another: 8 stalls, each its own")
    func eightAtOnce() throws {
        let count = 8
        let queues = (0..<count).map { DispatchQueue(label: "idle.many.\($0)") }
        let events = Locked<[Int: [StallEvent]]>([:])
        let detectors = queues.enumerated().map { index, queue in
            StallDetector(
                target: .queue(queue), threshold: .milliseconds(250), heartbeat: .milliseconds(25),
                idleHeartbeat: .milliseconds(100)
            ) { event in events.withLock { $0[index, default: []].append(event) } }
        }
        for detector in detectors { detector.start() }
        defer { for detector in detectors { detector.stop() } }
        // Long enough for every spacing to widen.
        Thread.sleep(forTimeInterval: 1)
        let blocks = Locked<[Int: Duration]>([:])
        let done = DispatchGroup()
        for (index, queue) in queues.enumerated() {
            done.enter()
            // Staggered by 37 ms: each block begins at another phase of its gap.
            queue.asyncAfter(deadline: .now() + .milliseconds(37 * index)) {
                let start = ContinuousClock.now
                usleep(600_000)
                blocks.withLock { $0[index] = ContinuousClock.now - start }
                done.leave()
            }
        }
        done.wait()
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline,
            events.withLock({ $0.values.filter { $0.contains { $0.phase == .ended } }.count }) < count
        {
            Thread.sleep(forTimeInterval: 0.05)
        }
        for detector in detectors { detector.waitForHandler() }
        for index in 0..<count {
            let seen = events.withLock { $0[index] ?? [] }
            let started = seen.filter { $0.phase == .started }
            let ended = seen.filter { $0.phase == .ended }
            #expect(started.count == 1 && ended.count == 1, "detector \(index): \(seen.map(\.phase))")
            guard let duration = ended.first?.duration, let block = blocks.withLock({ $0[index] }) else { continue }
            // Never longer than the block by over half a heartbeat (and the
            // answer's run, 10 ms beside busy processes); at most the widest
            // gap less half a heartbeat short, and the answer's wait for a core.
            #expect(duration <= block + .milliseconds(25), "detector \(index): \(duration) for a \(block) block")
            #expect(
                duration >= block - .milliseconds(100), "detector \(index): \(duration) for a \(block) block")
            #expect(started.first.map { $0.target.contains("idle.many.\(index)") } ?? false, "another's report")
        }
    }
}
