import Foundation
import Testing

@testable import StallDetection

/// The profile's stacks, call tree and exports (folded stacks, speedscope JSON),
/// from samples whose stacks are known.
@Suite("StallProfile call tree and exports")
struct CallTreeTests {
    static let frame = StallProfileTests.frame

    /// Innermost first, as samples are taken: `names` root first for reading.
    static func stack(_ names: String...) -> [StackFrame] {
        names.reversed().map { frame($0, 1, "App", false) }
    }

    /// 6 samples in C (A → B → C), 3 in D (A → B → D), 2 in A itself, 1 in a
    /// 3-deep recursion R → R → R under A.
    static func profile() -> StallProfile {
        var recorder = ProfileRecorder(capacity: 1_000)
        var time: Int64 = 0
        func add(_ frames: [StackFrame], _ count: Int) {
            for _ in 0..<count {
                recorder.add(frames, at: time)
                time += 10_000_000
            }
        }
        add(stack("start", "A", "B", "C"), 6)
        add(stack("start", "A", "B", "D"), 3)
        add(stack("start", "A"), 2)
        add(stack("start", "A", "R", "R", "R"), 1)
        return recorder.profile(interval: 10_000_000)
    }

    @Test("the stacks: each distinct one once, root first, with its count, most samples first")
    func stacks() {
        let profile = Self.profile()
        let stacks = profile.stacks.map { (profile.functions(of: $0).map(\.name), $0.samples) }
        #expect(
            stacks.map(\.0) == [
                ["start", "A", "B", "C"], ["start", "A", "B", "D"], ["start", "A"], ["start", "A", "R", "R", "R"],
            ])
        #expect(stacks.map(\.1) == [6, 3, 2, 1])
        #expect(profile.stacks.reduce(0) { $0 + $1.samples } == profile.sampleCount)
        let recursion = profile.functions.first { $0.name == "R" }
        #expect(recursion?.samples == 1, "a recursion counts once per sample in the function list")
    }

    @Test("the call tree: samples through each node, its own samples, children most samples first")
    func callTree() throws {
        let tree = Self.profile().callTree
        #expect(tree.function == nil && tree.samples == 12 && tree.selfSamples == 0)
        let start = try #require(tree.children.first)
        #expect(tree.children.count == 1 && start.function?.name == "start" && start.samples == 12)
        let a = try #require(start.children.first)
        #expect(a.function?.name == "A" && a.samples == 12 && a.selfSamples == 2)
        #expect(a.children.map { $0.function?.name } == ["B", "R"])
        let b = a.children[0]
        #expect(b.samples == 9 && b.selfSamples == 0)
        #expect(b.children.map { $0.function?.name } == ["C", "D"] && b.children.map(\.samples) == [6, 3])
        let r = a.children[1]
        #expect(
            r.children.first?.children.first?.function?.name == "R"
                && r.children.first?.children.first?.selfSamples == 1)
        let text = tree.description
        #expect(text.hasPrefix("call tree (12 samples):"), "\(text)")
        #expect(text.contains(" 50.0 %        C") && text.contains(" 25.0 %        D"), "\(text)")
    }

    @Test("folded stacks: one line a stack, root first, the count after a space; ';' in a name becomes a space")
    func folded() {
        let profile = Self.profile()
        #expect(
            profile.foldedStacks()
                == "start;A;B;C 6\nstart;A;B;D 3\nstart;A 2\nstart;A;R;R;R 1\n")
        var recorder = ProfileRecorder()
        recorder.add([Self.frame("f(a;b)\nx", 1, "App", false)], at: 0)
        #expect(recorder.profile(interval: 1).foldedStacks() == "f(a b) x 1\n")
        #expect(StallProfile.empty.foldedStacks().isEmpty && StallProfile.empty.callTree.samples == 0)
    }

    @Test("speedscope JSON: one sampled profile, a frame per function with file and line, weights in milliseconds")
    func speedscope() throws {
        let profile = Self.profile()
        let json = profile.speedscopeJSON(title: "Stall #1")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])
        #expect(object["$schema"] as? String == "https://www.speedscope.app/file-format-schema.json")
        #expect(object["name"] as? String == "Stall #1")
        let frames = try #require((object["shared"] as? [String: Any])?["frames"] as? [[String: Any]])
        #expect(frames.map { $0["name"] as? String } == profile.functions.map(\.name))
        #expect(frames.first { $0["name"] as? String == "C" }?["file"] as? String == "/src/C.swift")
        let profiles = try #require(object["profiles"] as? [[String: Any]])
        let sampled = try #require(profiles.first)
        #expect(sampled["type"] as? String == "sampled" && sampled["unit"] as? String == "milliseconds")
        let samples = try #require(sampled["samples"] as? [[Int]])
        #expect(samples == profile.stacks.map(\.functionIndices))
        let weights = try #require(sampled["weights"] as? [Double])
        // 12 samples 10 ms apart: 110 ms over 11 gaps, 10 ms a sample.
        #expect(weights == [60, 30, 20, 10])
        #expect(sampled["endValue"] as? Double == 120)
    }

    @Test("thinning and dropping keep the stacks equal to a recount of the samples kept")
    func thinned() {
        var recorder = ProfileRecorder(capacity: 50)
        for index in 0..<1_000 {
            recorder.add(Self.stack("start", index % 3 == 0 ? "A" : "B"), at: Int64(index))
        }
        recorder.dropSamples(before: 100)
        let profile = recorder.profile(interval: 1)
        #expect(profile.stacks.reduce(0) { $0 + $1.samples } == profile.sampleCount)
        let counts = Dictionary(
            uniqueKeysWithValues: profile.stacks.map { (profile.functions(of: $0).last?.name, $0.samples) })
        #expect(counts["A"] == profile.functions.first { $0.name == "A" }?.samples)
        #expect(counts["B"] == profile.functions.first { $0.name == "B" }?.samples)
    }

    @Test("uncertain frames are not in a stack; inlined frames are")
    func uncertainAndInlined() {
        var recorder = ProfileRecorder()
        let leaf = Self.frame("leaf", 1, "App", false)
        let inlined = StackFrame(
            address: leaf.address, function: "inlinedHelper", file: "/src/h.swift", line: 2, image: "App",
            isUncertain: false, isInlined: true)
        recorder.add([inlined, leaf, Self.frame("guess", 1, "App", true), Self.frame("start", 1, "App", false)], at: 0)
        let profile = recorder.profile(interval: 1)
        #expect(profile.stacks.count == 1)
        #expect(
            profile.stacks.first.map { profile.functions(of: $0).map(\.name) } == ["start", "leaf", "inlinedHelper"])
    }

    @Test("a fatal report keeps the stacks; a report cut to fit leaves them out first")
    func fatalReport() throws {
        let profile = Self.profile()
        var event = FatalReportTests.event
        event.profile = profile
        let read = try #require(FatalReportFile.decode(FatalReportFile(event).encoded())?.event)
        #expect(read.profile.stacks == profile.stacks && read.profile.callTree == profile.callTree)
        let bytes = FatalReportFile(event).encoded()
        let cut = try #require(FatalReportFile.decode(FatalReportFile(event).encodedWithinLimit(bytes.count - 1)))
        #expect(cut.profile.stacks == nil && cut.profile.functions.count == profile.functions.count)
        #expect(cut.truncation == "profile: call tree left out")
    }
}

extension CallTreeTests {
    /// Runs `stall-flamegraph` (built beside the test bundle, a dependency of
    /// this target) on `input`.
    static func renderFlameGraph(_ input: String, arguments: [String] = []) throws -> (svg: String, status: Int32) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
            .deletingLastPathComponent().appendingPathComponent("stall-flamegraph")
        process.arguments = arguments
        let stdin = Pipe()
        let stdout = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = FileHandle.nullDevice
        try process.run()
        stdin.fileHandleForWriting.write(Data(input.utf8))
        try stdin.fileHandleForWriting.close()
        let output = stdout.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (String(decoding: output, as: UTF8.self), process.terminationStatus)
    }

    @Test("stall-flamegraph draws the folded stacks: a frame per call path, widths by samples, names escaped")
    func flameGraph() throws {
        let folded = Self.profile().foldedStacks() + "start;<tag> & \"q\" 4\n"
        let (svg, status) = try Self.renderFlameGraph(folded, arguments: ["--title", "Stall & more"])
        #expect(status == 0)
        #expect(svg.hasPrefix("<?xml") && svg.hasSuffix("</svg>\n"))
        #expect(svg.contains(">Stall &amp; more</text>"))
        #expect(svg.contains("<title>all (16 samples, 100.0 %)</title>"))
        #expect(
            svg.contains("<title>C (6 samples, 37.5 %)</title>") && svg.contains("<title>D (3 samples, 18.8 %)</title>")
        )
        #expect(svg.contains("<title>&lt;tag&gt; &amp; &quot;q&quot; (4 samples, 25.0 %)</title>"))
        // The background, then all, start, A, B, C, D, R ×3, <tag>: one frame each.
        #expect(svg.components(separatedBy: "<rect x=").count - 1 == 11)
        let width = { (name: String) -> Double? in
            guard let range = svg.range(of: "<title>\(name) (") else { return nil }
            let rest = svg[range.upperBound...]
            guard let w = rest.range(of: "width=\"") else { return nil }
            return Double(rest[w.upperBound...].prefix { $0 != "\"" })
        }
        let c = try #require(width("C"))
        let d = try #require(width("D"))
        #expect(abs(c / d - 2) < 0.01, "\(c) \(d)")
        #expect(try Self.renderFlameGraph("no counts here\n").status == 1)
    }
}
