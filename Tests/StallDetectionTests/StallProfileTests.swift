import Testing

@testable import StallDetection

/// The pure parts of the profile: counting, thinning, ordering, and the pace.
@Suite("StallProfile (pure)")
struct StallProfileTests {
    /// A frame; one address per function and line, as in a real process.
    static func frame(_ name: String?, line: Int? = nil, image: String = "App", uncertain: Bool = false) -> StackFrame {
        let address =
            0x1000 + UInt((name ?? "?").utf8.reduce(0) { $0 &* 31 &+ Int($1) } & 0xFFFF) * 0x1000
            + UInt(line ?? 0)
        return StackFrame(
            address: address, function: name, file: name == nil ? nil : "/src/\(name!).swift", line: line, image: image,
            isUncertain: uncertain)
    }

    /// A stack: `leaf` called from `main` called from `start_thread`.
    static func stack(_ leaf: String, line: Int = 10) -> [StackFrame] {
        [frame(leaf, line: line), frame("main", line: 3), frame("start_thread", image: "libc.so.6")]
    }

    @Test("600 samples in A then 300 in B: both shown, 2:1, callers in every sample")
    func twoToOne() throws {
        var recorder = ProfileRecorder(capacity: 10_000)
        for index in 0..<900 { recorder.add(Self.stack(index < 600 ? "A" : "B"), at: Int64(index) * 1_000_000) }
        let profile = recorder.profile(interval: 1_000_000)
        #expect(profile.sampleCount == 900)
        let a = try #require(profile.functions.first { $0.name == "A" })
        let b = try #require(profile.functions.first { $0.name == "B" })
        #expect(a.samples == 600 && b.samples == 300)
        #expect(profile.functions.map(\.name) == ["main", "start_thread", "A", "B"])
        #expect(profile.span == .milliseconds(899))
        #expect(a.file == "/src/A.swift" && a.line == 10 && a.image == "App")
    }

    @Test("more than 500 samples: every second one goes, the stride doubles, shares stay, at most 500 kept")
    func thinningKeepsShares() throws {
        var recorder = ProfileRecorder()
        // A for 2/3 of the samples, B for 1/3, interleaved over 5,000 samples.
        for index in 0..<5_000 {
            recorder.add(Self.stack(index % 3 == 2 ? "B" : "A"), at: Int64(index))
            #expect(recorder.count <= StallProfile.maximumSampleCount)
        }
        let profile = recorder.profile(interval: 1)
        #expect(profile.sampleCount <= 500 && profile.sampleCount >= 250)
        #expect(recorder.stride >= 8)
        let a = try #require(profile.functions.first { $0.name == "A" })
        let b = try #require(profile.functions.first { $0.name == "B" })
        #expect(a.samples + b.samples == profile.sampleCount)
        let ratio = Double(a.samples) / Double(b.samples)
        #expect(ratio > 1.7 && ratio < 2.3, "\(a.samples):\(b.samples)")
        // Counts equal a recount of the samples kept.
        #expect(profile.functions.first { $0.name == "main" }?.samples == profile.sampleCount)
    }

    @Test("the samples stay spread over the whole stall after thinning")
    func thinningSpansTheStall() {
        var recorder = ProfileRecorder(capacity: 100)
        for index in 0..<1_000 { recorder.add(Self.stack("A"), at: Int64(index)) }
        #expect(recorder.samples.first?.time == 0)
        #expect((recorder.samples.last?.time ?? 0) >= 900)
    }

    @Test("a recursion counts once per sample; uncertain frames are ignored; the most frequent line is shown")
    func recursionAndLines() throws {
        var recorder = ProfileRecorder()
        let recursion = (0..<200).map { _ in Self.frame("recurse", line: 7) }
        recorder.add([Self.frame("leaf", line: 1)] + recursion + [Self.frame("junk", uncertain: true)], at: 0)
        recorder.add([Self.frame("leaf", line: 2), Self.frame("recurse", line: 9)], at: 1)
        recorder.add([Self.frame("leaf", line: 2), Self.frame("recurse", line: 9)], at: 2)
        let profile = recorder.profile(interval: 1)
        #expect(profile.functions.first { $0.name == "recurse" }?.samples == 3)
        #expect(!profile.functions.contains { $0.name == "junk" })
        #expect(profile.functions.first { $0.name == "leaf" }?.line == 2)
        #expect(profile.functions.first { $0.name == "recurse" }?.line == 9)
        // Equal counts: the callee first.
        #expect(profile.functions.map(\.name) == ["leaf", "recurse"])
    }

    @Test("frames without symbols count per image, without file or line")
    func unknownFrames() {
        var recorder = ProfileRecorder()
        recorder.add([Self.frame(nil, line: 4), Self.frame("main")], at: 0)
        let unknown = recorder.profile(interval: 1).functions.first { $0.name == "<unknown>" }
        #expect(unknown?.samples == 1 && unknown?.file == nil && unknown?.line == nil)
    }

    @Test("samples from before the stall began are dropped, and the counts with them")
    func dropBeforeStart() {
        var recorder = ProfileRecorder()
        recorder.add(Self.stack("early"), at: 10)
        recorder.add(Self.stack("A"), at: 20)
        recorder.dropSamples(before: 15)
        let profile = recorder.profile(interval: 1)
        #expect(profile.sampleCount == 1)
        #expect(!profile.functions.contains { $0.name == "early" })
    }

    /// The samples of `frames` in `raw`.
    static func count(_ frames: [RawFrame], in raw: RawProfile) -> Int {
        raw.samples.filter { $0.frames == frames }.count
    }

    static let busy = [RawFrame(address: 0xA000, isUncertain: false)]
    static let asleep = [RawFrame(address: 0xB000, isUncertain: false)]

    @Test("a busy phase whose thread answered late keeps its share of the time beside a sleeping one read at once")
    func busyPhaseKeepsItsShare() {
        var raw = RawProfile()
        // 602 ms busy, a look every 14 ms whose thread took 4 ms to answer
        // (it waited for a core; counted once a look, or rounded look by look,
        // 1.4 intervals would count 1), then 300 ms asleep, read at once every
        // 10 ms: the time is 2 : 1.
        var time: Int64 = 0
        for _ in 0..<43 {
            raw.add(look: Self.busy, start: time, seen: time + 4_000, continued: nil, baseInterval: 10_000)
            time += 14_000
        }
        for _ in 0..<30 {
            raw.add(look: Self.asleep, start: time, seen: time, continued: nil, baseInterval: 10_000)
            time += 10_000
        }
        let (a, b) = (Self.count(Self.busy, in: raw), Self.count(Self.asleep, in: raw))
        #expect(a == 60 && b == 30, "A \(a) : B \(b)")
        #expect(raw.samples.map(\.time) == raw.samples.map(\.time).sorted())
    }

    @Test("the sampler's own wait for a core counts for the stack it last saw, not the one it sees next")
    func samplersWaitCountsBackward() {
        var raw = RawProfile()
        // One look in the busy phase, then none for 650 ms (the sampler got no
        // core while the target spun), then the asleep phase on time: the wait
        // is the busy phase's but for the 50 ms after it ended (a transition
        // is off by at most the wait that spans it).
        raw.add(look: Self.busy, start: 0, seen: 0, continued: nil, baseInterval: 10_000)
        var time: Int64 = 650_000
        while time < 900_000 {
            raw.add(look: Self.asleep, start: time, seen: time, continued: nil, baseInterval: 10_000)
            time += 10_000
        }
        let (a, b) = (Self.count(Self.busy, in: raw), Self.count(Self.asleep, in: raw))
        #expect(a == 65 && b == 25, "A \(a) : B \(b)")
    }

    @Test("closed at the stall's end, the last look's stack counts until then: a starved last phase keeps its time")
    func closingCountsTheLastStretch() {
        var raw = RawProfile()
        // 300 ms asleep read on time, then the busy phase looked at 5 times
        // before the sampler starved until the stall ended at 900 ms.
        for index in 0..<30 {
            let time = Int64(index) * 10
            raw.add(look: Self.asleep, start: time, seen: time, continued: nil, baseInterval: 10)
        }
        for time in stride(from: Int64(300), through: 340, by: 10) {
            raw.add(look: Self.busy, start: time, seen: time, continued: nil, baseInterval: 10)
        }
        let closed = raw.closed(at: 900, continued: nil, baseInterval: 10)
        #expect(Self.count(Self.busy, in: closed) == 60 && Self.count(Self.asleep, in: closed) == 30)
        #expect(closed.samples.allSatisfy { $0.time <= 900 })
        // Closing is a copy: the profile itself goes on from its last look.
        #expect(Self.count(Self.busy, in: raw) == 5)
    }

    @Test("one stretch counts a quarter of the capacity at most; a stop's time does not count; a look counts once")
    func longStretchesAndStops() {
        var raw = RawProfile(capacity: 100)
        raw.add(look: Self.busy, start: 0, seen: 0, continued: nil, baseInterval: 10)
        raw.add(look: Self.asleep, start: 10_000_000, seen: 10_000_000, continued: nil, baseInterval: 10)
        #expect(Self.count(Self.busy, in: raw) == 26 && Self.count(Self.asleep, in: raw) == 1)
        // Stopped from 10_000_010 to 20_000_000: 5 ns ran after the continue.
        raw.add(look: Self.busy, start: 20_000_005, seen: 20_000_005, continued: 20_000_000, baseInterval: 10)
        #expect(Self.count(Self.asleep, in: raw) == 1 && Self.count(Self.busy, in: raw) == 27)
        // A look that saw none of the target's work counts the last stack up to
        // it (a quarter of the capacity at most), then nothing more.
        raw.add(look: nil, start: 30_000_000, seen: 30_000_000, continued: nil, baseInterval: 10)
        #expect(raw.count == 53)
        raw.add(look: Self.asleep, start: 40_000_000, seen: 40_000_000, continued: nil, baseInterval: 10)
        #expect(raw.count == 54)
    }

    @Test("copies added while the profile is thinned out count at the doubled interval: a look stands for its time")
    func lateLookAcrossThinning() {
        let frames = [RawFrame(address: 0x1000, isUncertain: false)]
        let late = [RawFrame(address: 0x2000, isUncertain: false)]
        var raw = RawProfile(capacity: 40)
        for index in 0..<38 {
            let time = Int64(index) * 10
            raw.add(look: frames, start: time, seen: time, continued: nil, baseInterval: 10)
        }
        // Its thread answered 100 ns late: 3 copies fill the profile, it is
        // thinned out (stride 2), and the rest counts at 20 ns a copy.
        raw.add(look: late, start: 380, seen: 480, continued: nil, baseInterval: 10)
        #expect(raw.stride == 2)
        #expect(Self.count(late, in: raw) * raw.stride * 10 == 100, "\(Self.count(late, in: raw)) copies")
        #expect(raw.samples.map(\.time) == raw.samples.map(\.time).sorted())
    }

    @Test("samples from after the stall ended are dropped")
    func dropAfterEnd() {
        let frames = [RawFrame(address: 0x1000, isUncertain: false)]
        var raw = RawProfile()
        for time in stride(from: Int64(0), through: 100, by: 10) { raw.add(frames, at: time) }
        raw.dropSamples(after: 55)
        #expect(raw.samples.map(\.time) == [0, 10, 20, 30, 40, 50])
    }

    @Test("the report: shares, file:line, callers in every sample summarised, at most 16 lines")
    func description() {
        var recorder = ProfileRecorder()
        let callers = (0..<10).map { Self.frame("caller\($0)") }
        for index in 0..<40 {
            let leaf = index < 20 ? "A" : "leaf\(index)"
            recorder.add([Self.frame(leaf, line: 5)] + callers, at: Int64(index) * 10_000_000)
        }
        let text = recorder.profile(interval: 10_000_000).description
        #expect(text.contains("where the time went (40 samples over 0.390 s, one every 10.0 ms):"), "\(text)")
        #expect(text.contains("  100.0 %  caller0 at /src/caller0.swift (App)"), "\(text)")
        #expect(text.contains("… and 5 callers in every sample"), "\(text)")
        #expect(text.contains("   50.0 %  A at /src/A.swift:5 (App)"), "\(text)")
        #expect(text.contains("more functions"), "\(text)")
        #expect(text.split(separator: "\n").count <= 19, "\(text)")
        #expect(StallProfile.empty.description.contains("no samples"))
    }

    // MARK: The pace

    @Test("cheap samples come every minimum interval, times the stride")
    func cheapSamples() {
        var pace = SamplingPace(minimumInterval: 5_000_000, budget: 0.01, burst: 2_000_000)
        #expect(pace.sampled(start: 0, cost: 10_000, stride: 1) == (5_000_000, false))
        #expect(pace.sampled(start: 5_000_000, cost: 10_000, stride: 4) == (25_000_000, false))
    }

    @Test("whatever samples cost, CPU spent stays within 1 % of the time plus the burst")
    func budgetHolds() {
        for cost in [Int64(1_000), 40_000, 300_000, 2_000_000, 30_000_000] {
            var pace = SamplingPace(minimumInterval: 5_000_000, budget: 0.01, burst: 2_000_000)
            var now: Int64 = 0
            var spent: Int64 = 0
            var samples = 0
            let end: Int64 = 60_000_000_000
            while now < end {
                spent += cost
                samples += 1
                now = pace.next(now: pace.sampled(start: now, cost: cost, stride: 1).next)
            }
            #expect(Double(spent) <= 0.01 * Double(now) + 2_000_000 + Double(cost), "cost \(cost): \(spent) ns")
            #expect(samples <= Int(end / 5_000_000) + 1)
        }
    }

    @Test("one costly sample (a first symbolication) delays the next by what it owes, not 100 times its cost")
    func costlyFirstSample() {
        var pace = SamplingPace(minimumInterval: 5_000_000, budget: 0.01, burst: 2_000_000)
        // 3 ms with 2 ms in the bucket: 1 ms owed, refilled in 100 ms.
        #expect(pace.sampled(start: 0, cost: 3_000_000, stride: 1, typical: false) == (100_000_000, false))
    }

    @Test("a few costly samples among cheap ones keep the rate; most samples well over the budget halve it")
    func costSpikes() {
        // 2 % at 10 ms: 200 µs a sample. Cheap ones cost 120 µs; spikes 300 µs.
        var pace = SamplingPace(minimumInterval: 10_000_000, budget: 0.02, burst: 2_000_000)
        var now: Int64 = 0
        for index in 0..<40 {
            let cost: Int64 = [3, 5, 7].contains(index % 8) ? 300_000 : 120_000  // 3 spikes in every 8
            let (next, slower) = pace.sampled(start: now, cost: cost, stride: 1)
            #expect(!slower, "sample \(index)")
            now = pace.next(now: next)
        }
        #expect(pace.interval == 10_000_000)
        var halved = false
        for _ in 0..<5 where !halved {
            let (next, slower) = pace.sampled(start: now, cost: 300_000, stride: 1)
            halved = slower
            now = pace.next(now: next)
        }
        #expect(halved && pace.interval == 20_000_000, "samples a half over the budget: the stride doubles")
    }

    @Test("a huge stride or cost saturates instead of trapping")
    func extremes() {
        var pace = SamplingPace()
        _ = pace.sampled(start: 0, cost: .max, stride: .max)
        #expect(pace.interval > 0)
        _ = pace.sampled(start: .max / 2, cost: 0, stride: 1 << 62)
        #expect(pace.interval > 0)
    }
}
