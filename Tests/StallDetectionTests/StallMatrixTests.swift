import Foundation
import Testing

/// The matrix of blocking cases, each on a serial queue (heartbeat) and on the main
/// thread under `RunLoop.main` (run-loop observer), in the `stall-probe` helper. CI
/// runs it against a release build (`STALL_PROBE=…/release/stall-probe`); `swift
/// test` runs it against the debug build beside the tests.
///
/// For each case the reported stack must show the user frames innermost first, with
/// the file and line of the call they are in (read from `// matrix:<name>` markers
/// in `Sources/stall-probe/Matrix.swift`), reach the thread's start, and contain no
/// uncertain frame; a stalled `usleep` must return 0 after its full time.
extension StallDetectorIntegrationTests {
    @Suite("Stall matrix (stall-probe, real time)")
    struct Matrix {
        /// A user frame the report must show: function name prefix and marker line.
        struct Expected: CustomStringConvertible {
            var function: String
            var marker: String?
            var description: String { "\(function) @\(marker ?? "-")" }
        }

        static let source: String = {
            let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent().appendingPathComponent("Sources/stall-probe/Matrix.swift")
            return (try? String(contentsOf: url, encoding: .utf8)) ?? ""
        }()

        /// The line of `// matrix:<name>` in Matrix.swift.
        static func line(of marker: String) -> Int? {
            for (index, line) in source.split(separator: "\n", omittingEmptySubsequences: false).enumerated()
            where line.hasSuffix("// matrix:\(marker)") {
                return index + 1
            }
            return nil
        }

        static let run = Expected(function: "runMatrixCase(", marker: "run")

        /// The user frames of each case, innermost first (frames between them, such as
        /// closures and thunks, may appear in between).
        static let cases: [(name: String, frames: [Expected], sleeps: Bool)] = [
            ("mutex", [.init(function: "matrixMutexWait(", marker: "mutex"), run], false),
            ("pipe", [.init(function: "matrixPipeRead(", marker: "pipe"), run], false),
            ("semaphore", [.init(function: "matrixSemaphoreWait(", marker: "semaphore"), run], false),
            (
                "recursion",
                [
                    .init(function: "matrixSleep(", marker: "sleep"),
                    .init(function: "matrixRecurse(depth:", marker: "recursion-bottom"),
                    .init(function: "matrixRecurse(depth:", marker: "recursion"), run,
                ], true
            ),
            (
                "busy",
                [
                    .init(function: "matrixBusy5(", marker: "busy5"), .init(function: "matrixBusy4(", marker: "busy4"),
                    .init(function: "matrixBusy3(", marker: "busy3"), .init(function: "matrixBusy2(", marker: "busy2"),
                    .init(function: "matrixBusy1(", marker: "busy1"), run,
                ], false
            ),
            ("sleep", [.init(function: "matrixSleep(", marker: "sleep"), run], true),
            (
                "destroy",
                [
                    .init(function: "matrixSleep(", marker: "sleep"),
                    .init(function: "MatrixSlowToFree.deinit", marker: "deinit"),
                    .init(function: "matrixDiscard<", marker: "destroy"),
                    .init(function: "matrixDestroy(", marker: "destroy-call"), run,
                ], true
            ),
            (
                "ccallback",
                [
                    .init(function: "matrixSleep(", marker: "sleep"),
                    .init(function: "matrixComparator(", marker: "ccallback"),
                    .init(function: "qsort", marker: nil),
                    // The qsort call: in the closure (debug), or in what the closure is
                    // inlined into (release: `Array.withUnsafeMutableBufferPointer`,
                    // itself inlined into `matrixSortWithCallback`); any name.
                    .init(function: "", marker: "ccallback-sort"),
                    .init(function: "matrixSortWithCallback(", marker: nil),
                    run,
                ], true
            ),
        ]

        static let arguments: [(String, String)] = cases.flatMap { [($0.name, "queue"), ($0.name, "main")] }

        @Test(
            "each case on a queue and on the main run loop: user frames in order, with file:line, to the thread's start",
            arguments: arguments)
        func matrixCase(name: String, target: String) throws {
            try check(name: name, target: target)
        }

        func check(name: String, target: String) throws {
            let expectation = try #require(Self.cases.first { $0.name == name })
            // No retry: a stall not reported, or reported without its frames in
            // order, is a lost or wrong report.
            let run = try ProbeRun.run(["matrix", name, target, "700"])
            #expect(run.exitStatus == 0)
            #expect(run.started.count == 1, "\(run.lines)")
            guard let report = run.started.first?.report else { return }
            let frames = report.split(separator: "\n").map(String.init).filter { $0.hasPrefix("  #") }
            let base = run.lines.first { $0.hasPrefix("BASE ") }.flatMap { UInt($0.dropFirst(5), radix: 16) }
            var position = 0
            for expected in expectation.frames {
                let found =
                    try frames[position...].firstIndex { Self.frame($0, matches: expected) }
                    ?? frames[position...].firstIndex { try Self.hasNoLine($0, of: expected, base: base) }
                guard let found else {
                    Issue.record("\(expected) not found in order (from frame \(position)):\n\(report)")
                    return
                }
                position = found + 1
            }
            #expect(!frames.contains { $0.hasSuffix(" ?") }, "no uncertain frame:\n\(report)")
            if name != "recursion" {
                // A function twice in a row is a leftover return address in its
                // locals taken for a caller (no case recurses but "recursion").
                let functions = frames.filter { !$0.contains("[inlined]") }.map(Self.function(of:))
                let repeated = zip(functions, functions.dropFirst()).first { $0 == $1 && $0.contains("matrix") }
                #expect(repeated == nil, "no function is its own caller:\n\(report)")
            }
            let root = target == "main" ? "__libc_start_call_main" : "start_thread"
            #expect(frames.contains { $0.contains(" \(root) ") }, "the thread's start is shown:\n\(report)")
            if name == "recursion" {
                // 600 calls: the bottom one, then 599 identical frames on one line.
                #expect(report.contains("matrixRecurse(depth:_:)") && report.contains(" × 599"), "\(report)")
            }
            if expectation.sleeps {
                // The sample did not interrupt the sleep: usleep returned 0 after its time.
                #expect(run.sleeps.first?.result == 0, "\(run.lines)")
                #expect((run.sleeps.first?.milliseconds ?? 0) >= 699, "\(run.lines)")
            }
        }

        /// Whether `text` is a frame of `expected`'s function shown without a
        /// line because the debug information gives its address none: line 0, code
        /// the compiler added (a value's destroy through its value witness table,
        /// `__swift_noop_void_return` for a trivial one), as llvm-symbolizer says
        /// for the same address. Printed when it happens; any other frame without
        /// its line fails the test.
        static func hasNoLine(_ text: String, of expected: Expected, base: UInt?) throws -> Bool {
            let fields = text.split(separator: " ")
            guard let base, expected.marker != nil, text.contains(" " + expected.function), !text.contains(" at "),
                fields.count >= 3, let address = UInt(fields[1].dropFirst(2), radix: 16), address > base
            else { return false }
            let isReturnAddress = fields[0] != "#0"
            let offset = address - base - (isReturnAddress ? 1 : 0)
            let symbolizer = "/usr/bin/llvm-symbolizer"
            guard FileManager.default.isExecutableFile(atPath: symbolizer) else { return false }
            let lines = try InlinedFrames.symbolize(symbolizer, binary: ProbeRun.probeURL.path, offset: offset)
            guard lines.last == "??:0" else { return false }
            let hex = String(offset, radix: 16)
            print("\(expected): \(text) has no line; llvm-symbolizer agrees (line 0 at offset 0x\(hex))")
            return true
        }

        /// The function of a report's frame line ("  #3 0x… name at file:line (image)").
        static func function(of text: String) -> String {
            let fields = text.split(separator: " ", maxSplits: 2)
            guard fields.count == 3 else { return text }
            let rest = String(fields[2])
            let end = rest.range(of: " at ")?.lowerBound ?? rest.range(of: " (", options: .backwards)?.lowerBound
            return end.map { String(rest[..<$0]) } ?? rest
        }

        static func frame(_ text: String, matches expected: Expected) -> Bool {
            guard text.contains(" " + expected.function) else { return false }
            guard let marker = expected.marker else { return true }
            guard let number = line(of: marker) else { return false }
            // An optimized build may attribute a call to the line of the statement after
            // it (llvm-symbolizer agrees: it is what the debug information says).
            let lines = ProbeRun.probeIsRelease ? [number, number + 1] : [number]
            return lines.contains { text.contains("Matrix.swift:\($0) ") }
        }
    }
}
