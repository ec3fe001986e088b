import Testing

@testable import StallDetection

private let ms: Int64 = 1_000_000

/// The profiler's session policy, pure: every time given, no thread sampled.
@Suite("ProfilerSessions (pure)")
struct ProfilerSessionsTests {
    static func look(
        _ address: UInt?, known: Int32?, found: Int32?, at time: Int64, misses: Int = 0
    ) -> ProfilerSessions.Look {
        ProfilerSessions.Look(
            frames: address.map { [RawFrame(address: $0, isUncertain: false)] }, known: known, found: found,
            misses: misses, labels: nil, start: time, seen: time, task: nil)
    }

    /// Opens a session at `now` and takes `count` samples of thread 7, each due
    /// when the last one said; returns the generation and the time after them.
    static func sampled(_ sessions: inout ProfilerSessions, count: Int, from now: Int64) -> (UInt64, Int64) {
        guard let (generation, first) = sessions.open(now: now) else { return (0, now) }
        var time = first
        for index in 0..<count {
            let result = sessions.sampled(
                look(0x1000 + UInt(index % 3), known: 7, found: 7, at: time), generation: generation,
                cost: 50_000, naming: 0, start: time, continued: nil)
            time = result?.next ?? time + 10 * ms
        }
        return (generation, time)
    }

    @Test("One session at a time: a second open while one is open, or any after stop(), opens nothing")
    func oneSessionAtATime() {
        var sessions = ProfilerSessions(keepsFatalReport: false)
        let first = sessions.open(now: 100 * ms)
        #expect(first != nil)
        #expect(sessions.open(now: 110 * ms) == nil, "a second session opened while one was open")
        _ = sessions.end(now: 120 * ms, continued: nil)
        let second = sessions.open(now: 130 * ms)
        #expect(second != nil && second?.generation != first?.generation, "a new session reused a generation")
        sessions.stop()
        #expect(sessions.open(now: 140 * ms) == nil)
        #expect(sessions.sampleDue(generation: second?.generation ?? 0) == nil, "a sample was due after stop()")
    }

    @Test("A sample of an ended session is not due and keeps nothing; one of the open session is")
    func staleGeneration() throws {
        var sessions = ProfilerSessions(keepsFatalReport: false)
        let openedOld = sessions.open(now: 0)
        let (old, _) = try #require(openedOld)
        _ = sessions.end(now: 5 * ms, continued: nil)
        let openedCurrent = sessions.open(now: 10 * ms)
        let (current, at) = try #require(openedCurrent)
        #expect(sessions.sampleDue(generation: old) == nil)
        let stale = sessions.sampled(
            Self.look(0x10, known: nil, found: 7, at: at), generation: old, cost: 1, naming: 0, start: at,
            continued: nil)
        #expect(stale == nil, "a stale sample was kept")
        #expect(sessions.sampleCount == 0)
        #expect(sessions.sampleDue(generation: current) != nil)
    }

    @Test("The target's answer ends what is due: no sample after it, and the profile ends at it")
    func answerEndsTheProfile() {
        var sessions = ProfilerSessions(keepsFatalReport: false)
        let (generation, after) = Self.sampled(&sessions, count: 20, from: 0)
        let answer = after / 2
        sessions.answered(at: answer)
        sessions.answered(at: after)  // a later answer does not move the end
        #expect(sessions.sampleDue(generation: generation) == nil, "a sample was due after the answer")
        let gathered = sessions.end(now: after + 50 * ms, continued: nil)
        let latest = gathered?.recorder.samples.map(\.time).max() ?? .max
        #expect(latest <= answer, "a sample from \(latest), after the answer at \(answer), is in the profile")
        #expect(!sessions.isOpen)
    }

    @Test("Samples that find no thread count their misses; finding one resets them")
    func missesCount() throws {
        var sessions = ProfilerSessions(keepsFatalReport: false)
        let openedGeneration = sessions.open(now: 0)
        let (generation, at) = try #require(openedGeneration)
        var time = at
        for expected in 1...3 {
            let next = sessions.sampled(
                Self.look(nil, known: nil, found: nil, at: time, misses: expected - 1), generation: generation,
                cost: 10_000, naming: 0, start: time, continued: nil)
            time = try #require(next).next
            #expect(sessions.sampleDue(generation: generation)?.misses == expected)
            #expect(sessions.sampleDue(generation: generation)?.thread == nil)
        }
        _ = sessions.sampled(
            Self.look(0x20, known: nil, found: 9, at: time, misses: 3), generation: generation, cost: 10_000,
            naming: 0, start: time, continued: nil)
        let due = try #require(sessions.sampleDue(generation: generation))
        #expect(due.misses == 0 && due.thread == 9)
    }

    @Test("`.started` choosing another thread drops the samples of the one followed, and its later looks")
    func startedChoosesTheThread() throws {
        var sessions = ProfilerSessions(keepsFatalReport: false)
        let (generation, after) = Self.sampled(&sessions, count: 10, from: 0)
        #expect((sessions.sampleCount ?? 0) > 0)
        let opened = sessions.stallStarted(
            thread: 11, usable: true, activities: ["checkout"], start: 0, answered: 0, now: after)
        #expect(opened == nil, "`.started` opened a second session")
        #expect(sessions.sampleCount == 0, "samples of thread 7 stayed after `.started` chose thread 11")
        // A look that was under way on thread 7 is not the stall's.
        _ = sessions.sampled(
            Self.look(0x30, known: 7, found: 7, at: after), generation: generation, cost: 10_000, naming: 0,
            start: after, continued: nil)
        #expect(sessions.sampleCount == 0)
        #expect(sessions.gathered(now: after, continued: nil)?.activities == ["checkout"])
        #expect(sessions.sampleDue(generation: generation)?.thread == 11)
    }

    @Test("`.started` with no session open opens one whose profile ends at an answer after the stall's start")
    func startedOpensASession() throws {
        var sessions = ProfilerSessions(keepsFatalReport: false)
        let opened = sessions.stallStarted(
            thread: 3, usable: true, activities: [], start: 100 * ms, answered: 400 * ms, now: 500 * ms)
        let (generation, _) = try #require(opened)
        #expect(sessions.sampleDue(generation: generation) == nil, "a sample was due after the answer")
        // An answer from before the stall's start is not its end.
        var other = ProfilerSessions(keepsFatalReport: false)
        let started = other.stallStarted(
            thread: 3, usable: true, activities: [], start: 100 * ms, answered: 50 * ms, now: 0)
        let second = try #require(started)
        #expect(other.sampleDue(generation: second.generation)?.thread == 3)
    }

    @Test("The first two samples with a stack before `.started` are prefetched, none after")
    func prefetch() throws {
        var sessions = ProfilerSessions(keepsFatalReport: false)
        let openedGeneration = sessions.open(now: 0)
        let (generation, at) = try #require(openedGeneration)
        var time = at
        var prefetched: [Bool] = []
        for _ in 0..<4 {
            let sampled = sessions.sampled(
                Self.look(0x40, known: 7, found: 7, at: time), generation: generation, cost: 10_000, naming: 0,
                start: time, continued: nil)
            let result = try #require(sampled)
            prefetched.append(result.prefetch)
            time = result.next
        }
        #expect(prefetched == [true, true, false, false])
    }

    @Test("Naming code for the first time is paid from the allowance: the pace does not slow for it")
    func namingAllowance() throws {
        var charged = ProfilerSessions(keepsFatalReport: false)
        var forgiven = ProfilerSessions(keepsFatalReport: false)
        let openedG1 = charged.open(now: 0)
        let (g1, t1) = try #require(openedG1)
        let openedG2 = forgiven.open(now: 0)
        let (g2, t2) = try #require(openedG2)
        let cost = 40 * ms
        let slowResult = charged.sampled(
            Self.look(0x50, known: 7, found: 7, at: t1), generation: g1, cost: cost, naming: 0, start: t1,
            continued: nil)
        let fastResult = forgiven.sampled(
            Self.look(0x50, known: 7, found: 7, at: t2), generation: g2, cost: cost, naming: cost, start: t2,
            continued: nil)
        let (slow, fast) = (try #require(slowResult), try #require(fastResult))
        #expect(fast.next < slow.next, "naming cost was charged: next at \(fast.next) against \(slow.next)")
    }

    @Test("The fatal report is due every 250 ms once `.started` was emitted, and only when one is kept")
    func fatalRefresh() throws {
        let event = StallEvent(
            id: 1, phase: .started, duration: .milliseconds(300), threshold: .milliseconds(100), target: "t",
            backtrace: .unavailable("not sampled"), samplingTime: .zero)
        for keeps in [true, false] {
            var sessions = ProfilerSessions(keepsFatalReport: keeps)
            #expect(sessions.open(now: 0) != nil)
            #expect(sessions.dueRefresh(now: 10_000 * ms, continued: nil) == nil, "due before `.started`")
            sessions.stallReported(event, start: 0, at: 100 * ms)
            #expect(sessions.dueRefresh(now: 349 * ms, continued: nil) == nil)
            #expect((sessions.dueRefresh(now: 350 * ms, continued: nil) != nil) == keeps)
            #expect(sessions.dueRefresh(now: 599 * ms, continued: nil) == nil, "due twice in 250 ms")
            #expect((sessions.dueRefresh(now: 600 * ms, continued: nil) != nil) == keeps)
        }
    }
}
