import Foundation
import Testing

extension StallDetectorIntegrationTests {
    /// Inlined frames, checked against `llvm-symbolizer --inlining` on the same
    /// addresses of the same binary: for each return address in the helper, the
    /// frames it stands for (inlined ones first, innermost first) with their file
    /// and line, in the same order. Against a release build (CI) the case really
    /// has two inlined frames; a debug build inlines nothing and the comparison
    /// still holds.
    @Suite("Inlined frames (stall-probe, real time)")
    struct InlinedFrames {
        struct Frame {
            var index: Int
            var address: UInt
            var inlined: Bool
            var image: String
            var location: String?
        }

        @Test("every frame of the helper matches llvm-symbolizer --inlining: order, address, inlined flag, file:line")
        func matchesSymbolizer() throws {
            let symbolizer = "/usr/bin/llvm-symbolizer"
            try #require(FileManager.default.isExecutableFile(atPath: symbolizer), "llvm-symbolizer is installed")
            // No retry: a stall not reported is a lost report.
            let run = try ProbeRun.run(["matrix", "inlined", "queue", "700"])
            #expect(run.started.count == 1, "\(run.lines.suffix(8))")
            let base = try #require(
                run.lines.first { $0.hasPrefix("BASE ") }.flatMap { UInt($0.dropFirst(5), radix: 16) })
            let frames = run.lines.compactMap { line -> Frame? in
                let fields = line.split(separator: " ").map(String.init)
                guard fields.count == 7, fields[0] == "FRAME", let index = Int(fields[1]),
                    let address = UInt(fields[2], radix: 16)
                else { return nil }
                return Frame(
                    index: index, address: address, inlined: fields[3] == "1", image: fields[5],
                    location: fields[6] == "-" ? nil : fields[6])
            }
            try #require(!frames.isEmpty, "\(run.lines)")
            // The helper's return addresses, each with the frames it stands for.
            var groups: [(address: UInt, frames: [Frame])] = []
            for frame in frames where frame.index > 0 && frame.image == "stall-probe" {
                if let last = groups.last, last.address == frame.address, last.frames.last?.inlined == true {
                    groups[groups.count - 1].frames.append(frame)
                } else {
                    groups.append((frame.address, [frame]))
                }
            }
            try #require(groups.count >= 3, "\(run.lines)")
            for group in groups {
                // Only the last frame of a group is the real one; the others are inlined into it.
                #expect(group.frames.dropLast().allSatisfy(\.inlined) && !group.frames.last!.inlined)
                let expected = try Self.symbolize(
                    symbolizer, binary: ProbeRun.probeURL.path, offset: group.address - base - 1)
                let ours = group.frames.map { $0.location.map(Self.fileAndLine) ?? "??:0" }
                #expect(ours == expected, "0x\(String(group.address, radix: 16)): ours \(ours), llvm \(expected)")
            }
            if ProbeRun.probeIsRelease {
                let outer = groups.first {
                    $0.frames.contains { $0.location?.hasSuffix("Matrix.swift:\(line("inlined-outer"))") == true }
                }
                #expect(
                    outer?.frames.count == 3,
                    "inlinedInner and inlinedMiddle are inlined into inlinedOuter: \(run.lines)")
            }
        }

        func line(_ marker: String) -> Int { StallDetectorIntegrationTests.Matrix.line(of: marker) ?? -1 }

        static func fileAndLine(_ location: String) -> String {
            let parts = location.split(separator: ":")
            guard parts.count >= 2 else { return location }
            return "\(URL(fileURLWithPath: String(parts[0])).lastPathComponent):\(parts[1])"
        }

        /// llvm-symbolizer's frames for one file offset: "file:line" per frame,
        /// innermost first.
        static func symbolize(_ symbolizer: String, binary: String, offset: UInt) throws -> [String] {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: symbolizer)
            process.arguments = ["--inlining", "--obj=\(binary)", "0x" + String(offset, radix: 16)]
            let output = Pipe()
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            try process.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            let lines = String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
            // Pairs of lines: function, then file:line:column.
            return stride(from: 1, to: lines.count, by: 2).map { index in
                let parts = lines[index].split(separator: ":")
                guard parts.count >= 2, parts[1] != "0" else { return "??:0" }
                return "\(URL(fileURLWithPath: String(parts[0])).lastPathComponent):\(parts[1])"
            }
        }
    }
}
