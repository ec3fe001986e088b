import Dispatch
import Foundation
import Testing

@testable import StallDetection

#if canImport(Glibc)
import Glibc
#endif

/// The fatal report file, its truncation and the profile exports under hostile
/// conditions: paths at the system's limits, objects planted at the path, races
/// between writer, remover and takers, forged reports, a full disk, and
/// `stall-flamegraph` fed hostile input. The cases that need a non-root victim
/// run when their environment variable names a prepared directory.
@Suite(
    "Fatal report files and profile exports at their edges: paths, planted objects, races, forged input", .serialized)
struct FatalReportFileEdgeCaseTests {
    static func event(
        target: String = "queue 'attack'", activities: [String] = [], profile: StallProfile = .empty
    ) -> StallEvent {
        let frames = (0..<8).map {
            StackFrame(
                address: UInt(0x1000 + $0), function: "f\($0)", file: "a.swift", line: $0, image: "x",
                isUncertain: false)
        }
        return StallEvent(
            id: 7, phase: .started, duration: .milliseconds(300), threshold: .milliseconds(250), target: target,
            backtrace: StallBacktrace(frames: frames, threadID: 1, unavailableReason: nil),
            samplingTime: .milliseconds(1), profile: profile, activities: activities)
    }

    static func freshDirectory(_ name: String, mode: mode_t = 0o755) -> String {
        let path = "/tmp/fatal-report-hostile-\(getpid())-\(name)"
        _ = try? FileManager.default.removeItem(atPath: path)
        mkdir(path, mode)
        chmod(path, mode)
        return path
    }

    static func writeFile(_ path: String, _ bytes: [UInt8]) {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        precondition(descriptor >= 0, "open \(path): \(errno)")
        _ = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        close(descriptor)
    }

    static func exists(_ path: String) -> Bool {
        var status = stat()
        return lstat(path, &status) == 0
    }

    static func leftovers(in directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter {
            $0.hasPrefix(".") && $0.hasSuffix(".tmp")
        }
    }

    /// A directory chain under /tmp so that `directory + "/" + name` is exactly
    /// `length` bytes.
    static func longPath(length: Int, name: String) -> String {
        var directory = freshDirectory("long")
        let target = length - name.utf8.count - 1
        while directory.utf8.count < target {
            let room = target - directory.utf8.count - 1
            let component = String(repeating: "d", count: min(200, room))
            if room < 1 { break }
            directory += "/" + component
            mkdir(directory, 0o755)
        }
        return directory + "/" + name
    }

    // MARK: Promise 1 and 2: paths at the limit

    @Test("A report at a 4095-byte path (short name) is written and taken")
    func longPathReport() {
        let path = Self.longPath(length: 4095, name: "r")
        #expect(path.utf8.count == 4095)
        let writer = FatalReportWriter(path: path)
        writer.write(Self.event())
        writer.flush()
        let written = Self.exists(path)
        print("long path: writer wrote the report: \(written)")
        #expect(written, "writer: no report at a 4095-byte path")
        Self.writeFile(path, FatalReportFile(Self.event()).encoded())
        let taken = StallDetector.takeFatalStallReport(at: path)
        print(
            "long path: take returned \(taken == nil ? "nil" : "the report"), file still there: \(Self.exists(path))"
        )
        #expect(taken != nil, "take: a valid report at a 4095-byte path gives nil")
    }

    @Test("A report whose name is 255 bytes is written and taken")
    func longNameReport() {
        let directory = Self.freshDirectory("name255")
        let path = directory + "/" + String(repeating: "n", count: 255)
        let writer = FatalReportWriter(path: path)
        writer.write(Self.event())
        writer.flush()
        #expect(Self.exists(path))
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
    }

    @Test("A path without a directory (relative) is written and taken in the working directory")
    func relativePath() {
        let directory = Self.freshDirectory("relative")
        let saved = FileManager.default.currentDirectoryPath
        chdir(directory)
        defer { chdir(saved) }
        let writer = FatalReportWriter(path: "report.json")
        writer.write(Self.event())
        writer.flush()
        #expect(Self.exists(directory + "/report.json"))
        #expect(StallDetector.takeFatalStallReport(at: "report.json") != nil)
        #expect(Self.leftovers(in: directory).isEmpty)
    }

    // MARK: Promise 1: modes

    @Test("The report is mode 0600 whatever the umask (0o777 and 0o000)")
    func umasks() {
        for mask: mode_t in [0o777, 0o000] {
            let directory = Self.freshDirectory("umask\(mask)")
            let path = directory + "/report.json"
            let old = umask(mask)
            let writer = FatalReportWriter(path: path)
            writer.write(Self.event())
            writer.flush()
            umask(old)
            var status = stat()
            #expect(stat(path, &status) == 0)
            print("umask \(String(mask, radix: 8)): mode \(String(status.st_mode & 0o7777, radix: 8))")
            #expect(status.st_mode & 0o7777 == 0o600)
            #expect(StallDetector.takeFatalStallReport(at: path) != nil)
        }
    }

    // MARK: Promise 1: planted objects at the report path

    @Test("A directory planted at the report path: left alone, nothing written beside it, no crash")
    func plantedDirectory() {
        // Nothing can replace another user's directory: the report cannot be
        // written there (documented), and the writer must fail cleanly.
        let directory = Self.freshDirectory("planted-dir", mode: 0o1777)
        let path = directory + "/report.json"
        mkdir(path, 0o755)
        let writer = FatalReportWriter(path: path)
        writer.write(Self.event())
        writer.flush()
        var status = stat()
        lstat(path, &status)
        #expect(status.st_mode & S_IFMT == S_IFDIR, "the planted directory is left alone")
        #expect(Self.leftovers(in: directory).isEmpty, "no temporary file is left")
        #expect(StallDetector.takeFatalStallReport(at: path) == nil)
    }

    @Test("A symbolic link and a FIFO planted at the report path are replaced, their targets untouched")
    func plantedLinkAndFIFO() {
        let directory = Self.freshDirectory("planted-link", mode: 0o1777)
        let victim = Self.freshDirectory("victim") + "/victim"
        Self.writeFile(victim, Array("keep".utf8))
        let path = directory + "/report.json"
        symlink(victim, path)
        let writer = FatalReportWriter(path: path)
        writer.write(Self.event())
        writer.flush()
        #expect((try? String(contentsOfFile: victim, encoding: .utf8)) == "keep")
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
        mkfifo(path, 0o666)
        writer.write(Self.event())
        writer.flush()
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
    }

    // MARK: Promise 2: what take does with things that are not reports

    @Test("A Unix socket at the report path gives nil and is removed")
    func socketAtPath() {
        let directory = Self.freshDirectory("socket")
        let path = directory + "/report.json"
        #if canImport(Darwin)
        let descriptor = socket(AF_UNIX, SOCK_STREAM, 0)
        #else
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        #endif
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in path.utf8.enumerated() { raw[index] = byte }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        #expect(bound == 0)
        close(descriptor)
        let taken = StallDetector.takeFatalStallReport(at: path)
        let left = Self.leftovers(in: directory)
        print(
            "socket: take -> \(String(describing: taken)), at path: \(Self.exists(path)), hidden leftovers: \(left)"
        )
        #expect(taken == nil)
        #expect(!Self.exists(path) && left.isEmpty, "the socket is not removed: it stays under a hidden name")
    }

    @Test("Corrupt, empty, truncated, oversized, FIFO, link and directory objects: nil, removed, never blocking")
    func foreignObjects() {
        let directory = Self.freshDirectory("foreign")
        let path = directory + "/report.json"
        let good = FatalReportFile(Self.event()).encoded()
        let cases: [(String, () -> Void)] = [
            ("empty", { Self.writeFile(path, []) }),
            ("truncated", { Self.writeFile(path, Array(good.prefix(good.count / 2))) }),
            ("garbage", { Self.writeFile(path, [0xff, 0xfe, 0x00, 0x7b]) }),
            ("deep nesting", { Self.writeFile(path, Array(repeating: UInt8(ascii: "["), count: 1 << 20)) }),
            ("16 MB + 1", { Self.writeFile(path, Array(repeating: UInt8(ascii: " "), count: (16 << 20) + 1)) }),
            ("fifo", { mkfifo(path, 0o666) }),
            ("dangling link", { symlink("/nonexistent/x", path) }),
        ]
        for (name, plant) in cases {
            plant()
            let taken = StallDetector.takeFatalStallReport(at: path)
            print(
                "foreign \(name): \(taken == nil ? "nil" : "EVENT"), left: \(Self.exists(path)) \(Self.leftovers(in: directory))"
            )
            #expect(taken == nil, "\(name)")
            #expect(!Self.exists(path) && Self.leftovers(in: directory).isEmpty, "\(name) not removed")
        }
        mkdir(path, 0o755)
        #expect(StallDetector.takeFatalStallReport(at: path) == nil)
        #expect(Self.exists(path))
    }

    @Test("A report padded with whitespace to exactly 16 MB is accepted; the writer's limit and the reader's agree")
    func exactLimit() {
        let directory = Self.freshDirectory("limit")
        let path = directory + "/report.json"
        var bytes = FatalReportFile(Self.event()).encoded()
        bytes += Array(repeating: UInt8(ascii: " "), count: (16 << 20) - bytes.count)
        Self.writeFile(path, bytes)
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
    }

    @Test("Of 8 threads taking one report at once, exactly one gets it (300 rounds)")
    func concurrentTakers() {
        let directory = Self.freshDirectory("takers")
        let path = directory + "/report.json"
        let bytes = FatalReportFile(Self.event()).encoded()
        var bad = 0
        for _ in 0..<300 {
            Self.writeFile(path, bytes)
            let got = Locked(0)
            DispatchQueue.concurrentPerform(iterations: 8) { _ in
                if StallDetector.takeFatalStallReport(at: path) != nil { got.withLock { $0 += 1 } }
            }
            if got.withLock({ $0 }) != 1 { bad += 1 }
        }
        #expect(bad == 0)
        #expect(Self.leftovers(in: directory).isEmpty)
    }

    @Test("Writer and takers racing: every taken report decodes whole (no torn file)")
    func writerVersusTakers() {
        let directory = Self.freshDirectory("writer-takers")
        let path = directory + "/report.json"
        let writer = FatalReportWriter(path: path)
        let big = Self.event(activities: (0..<32).map { "activity \($0) " + String(repeating: "x", count: 4000) })
        let stop = Locked(false)
        let torn = Locked(0)
        let taken = Locked(0)
        DispatchQueue.concurrentPerform(iterations: 3) { worker in
            if worker == 0 {
                for _ in 0..<400 {
                    writer.write(big)
                    writer.flush()
                }
                stop.withLock { $0 = true }
            } else {
                while !stop.withLock({ $0 }) {
                    if !Self.exists(path) { continue }
                    if let event = StallDetector.takeFatalStallReport(at: path) {
                        taken.withLock { $0 += 1 }
                        if event.activities.count != 32 { torn.withLock { $0 += 1 } }
                    }
                }
            }
        }
        print("writer vs takers: taken \(taken.withLock { $0 }), torn \(torn.withLock { $0 })")
        #expect(torn.withLock { $0 } == 0)
        #expect(Self.leftovers(in: directory).isEmpty)
    }

    // MARK: Promise 1: stop() and .ended remove without waiting; no report after

    @Test("remove() racing a write: the file never exists after remove() returned")
    func removeRacingWrite() {
        let directory = Self.freshDirectory("remove-race")
        let path = directory + "/report.json"
        var late = 0
        for round in 0..<300 {
            let writer = FatalReportWriter(path: path)
            writer.write(Self.event(activities: ["r\(round)"]))
            if round % 3 == 1 { usleep(UInt32(round % 50) * 10) }
            writer.remove()
            writer.flush()
            if Self.exists(path) { late += 1 }
            unlink(path)
        }
        #expect(late == 0)
        #expect(Self.leftovers(in: directory).isEmpty)
    }

    @Test("A full disk (64 KB tmpfs): the old report stays whole, no temporary file is left")
    func fullDisk() throws {
        let mount = Self.freshDirectory("tmpfs")
        guard Self.shell("mount -t tmpfs -o size=64k tmpfs \(mount)") == 0 else { return }
        defer { _ = Self.shell("umount \(mount)") }
        let path = mount + "/report.json"
        let writer = FatalReportWriter(path: path)
        writer.write(Self.event(activities: ["small"]))
        writer.flush()
        #expect(Self.exists(path))
        // Fill most of the disk, then write a report that does not fit.
        Self.writeFile(mount + "/filler", Array(repeating: 1, count: 40 << 10))
        writer.write(Self.event(activities: (0..<32).map { _ in String(repeating: "y", count: 4000) }))
        writer.flush()
        let event = StallDetector.takeFatalStallReport(at: path)
        print("full disk: old report \(event?.activities ?? ["<none>"]), leftovers \(Self.leftovers(in: mount))")
        #expect(event?.activities == ["small"])
        #expect(Self.leftovers(in: mount).isEmpty)
    }

    @Test("A read-only directory: the report is read where it is and stays")
    func readOnlyDirectory() {
        let mount = Self.freshDirectory("ro")
        guard Self.shell("mount -t tmpfs -o size=1m tmpfs \(mount)") == 0 else { return }
        defer { _ = Self.shell("umount \(mount)") }
        let path = mount + "/report.json"
        Self.writeFile(path, FatalReportFile(Self.event()).encoded())
        Self.writeFile(mount + "/garbage.json", Array("not json".utf8))
        _ = Self.shell("mount -o remount,ro \(mount)")
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
        #expect(Self.exists(path))
        #expect(StallDetector.takeFatalStallReport(at: mount + "/garbage.json") == nil)
    }

    // MARK: Promise 2: a report written by another user

    @Test("A valid-format report planted by another user (nobody, mode 0644) is taken as genuine")
    func forgedByOtherUser() {
        let directory = Self.freshDirectory("forged", mode: 0o1777)
        let path = directory + "/report.json"
        let forged = FatalReportFile(Self.event(target: "FORGED BY NOBODY"))
        let source = directory + "/src"
        Self.writeFile(source, forged.encoded())
        #expect(Self.shell("setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'cat \(source) > \(path)'") == 0)
        unlink(source)
        var status = stat()
        lstat(path, &status)
        let event = StallDetector.takeFatalStallReport(at: path)
        print(
            "forged: owner uid \(status.st_uid) mode \(String(status.st_mode & 0o777, radix: 8)) -> target \(event?.target ?? "nil")"
        )
        #expect(event == nil, "a file written by another user is taken as this program's report")
    }

    // MARK: Promise 1/2 as a non-root victim in a sticky shared directory

    @Test(
        "As nobody in a sticky directory: a file planted by another user at the path",
        .enabled(
            if: ProcessInfo.processInfo.environment["FATAL_REPORT_NOBODY_DIR"] != nil, "needs a prepared directory"))
    func nobodyVictim() {
        guard let directory = ProcessInfo.processInfo.environment["FATAL_REPORT_NOBODY_DIR"] else { return }
        let path = directory + "/report.json"
        // Planted by root beforehand: a valid-format report owned by root, mode 0644.
        let first = StallDetector.takeFatalStallReport(at: path)
        let second = StallDetector.takeFatalStallReport(at: path)
        print(
            "nobody take: first \(first?.target ?? "nil"), second \(second?.target ?? "nil"), still there \(Self.exists(path))"
        )
        #expect(first == nil || second == nil, "the same report is taken twice and is never removed")
        let writer = FatalReportWriter(path: path)
        writer.write(Self.event(target: "NOBODY'S OWN STALL"))
        writer.flush()
        let mine = StallDetector.takeFatalStallReport(at: path)
        print("nobody write: after the detector's write the path holds \(mine?.target ?? "nil")")
        #expect(mine?.target == "NOBODY'S OWN STALL", "the detector's report was never written")
    }

    @Test(
        "As nobody: an unreadable file (mode 000) of one's own at the path gives nil and is removed",
        .enabled(
            if: ProcessInfo.processInfo.environment["FATAL_REPORT_NOBODY_OWN_DIR"] != nil, "needs a prepared directory")
    )
    func unreadableAsNobody() {
        guard let directory = ProcessInfo.processInfo.environment["FATAL_REPORT_NOBODY_OWN_DIR"] else { return }
        let path = directory + "/report.json"
        Self.writeFile(path, Array("not a report".utf8))
        chmod(path, 0)
        let taken = StallDetector.takeFatalStallReport(at: path)
        print(
            "unreadable: take \(taken == nil ? "nil" : "EVENT"), at path \(Self.exists(path)), hidden leftovers \(Self.leftovers(in: directory))"
        )
        #expect(taken == nil)
        #expect(!Self.exists(path) && Self.leftovers(in: directory).isEmpty, "left behind under a hidden name")
    }

    // MARK: Promise 2: a forged report that decodes and then traps

    @Test("A forged report with a 300 000-deep stack (no detector writes one): rejected, nothing crashes")
    func deepForgedStack() {
        let directory = Self.freshDirectory("deep")
        let path = directory + "/report.json"
        var file = FatalReportFile(Self.event())
        file.profile.sampleCount = 1
        file.profile.functions = [.init(name: "f", file: nil, line: nil, image: nil, samples: 1)]
        file.profile.stacks = [.init(functions: Array(repeating: 0, count: 300_000), samples: 1)]
        let bytes = file.encoded()
        print("deep: \(bytes.count) bytes")
        Self.writeFile(path, bytes)
        let event = StallDetector.takeFatalStallReport(at: path)
        print("deep: take returned \(event == nil ? "nil" : "an event"); building callTree")
        let tree = event?.profile.callTree
        print("deep: callTree built \(tree?.samples ?? -1)")
        #expect(event == nil, "a stack deeper than maximumStackDepth is not a detector's")
    }

    @Test("A forged report whose stacks sum to more than sampleCount is accepted")
    func forgedStackSums() {
        let directory = Self.freshDirectory("sums")
        let path = directory + "/report.json"
        var file = FatalReportFile(Self.event())
        file.profile.sampleCount = 2
        file.profile.functions = [.init(name: "f", file: nil, line: nil, image: nil, samples: 2)]
        file.profile.stacks = Array(repeating: .init(functions: [0], samples: 2), count: 1000)
        Self.writeFile(path, file.encoded())
        let event = StallDetector.takeFatalStallReport(at: path)
        let sum = event?.profile.stacks.reduce(0) { $0 + $1.samples } ?? -1
        print(
            "sums: sampleCount \(event?.profile.sampleCount ?? -1), stacks sum \(sum), callTree root \(event?.profile.callTree.samples ?? -1)"
        )
        #expect(event == nil || sum == event?.profile.sampleCount)
    }

    // MARK: Promise 3: truncation

    @Test("Huge activity labels are cut to 4 KB first and the report fits in 16 MB")
    func hugeLabels() {
        let labels = (0..<32).map { "<&;\n\u{0}\($0)" + String(repeating: "é", count: 400_000) }
        let file = FatalReportFile(Self.event(activities: labels))
        let bytes = file.encodedWithinLimit()
        let decoded = FatalReportFile.decode(bytes)
        print("labels: \(bytes.count) bytes, note: \(decoded?.truncation ?? "nil")")
        #expect(!bytes.isEmpty && bytes.count <= 16 << 20)
        #expect(decoded?.activities.count == 32)
        #expect(decoded?.truncation?.hasPrefix("32 activity labels cut") == true)
    }

    @Test("A label of one 20 000-scalar grapheme cluster is cut without trapping")
    func hugeGrapheme() {
        let label = "a" + String(repeating: "\u{301}", count: 20_000)
        let labels = Array(repeating: label, count: 32) + [String(repeating: "z", count: 17 << 20)]
        let bytes = FatalReportFile(Self.event(activities: labels)).encodedWithinLimit()
        let decoded = FatalReportFile.decode(bytes)
        print(
            "grapheme: \(bytes.count) bytes, first label \(decoded?.activities.first?.utf8.count ?? -1) bytes, note: \(decoded?.truncation ?? "nil")"
        )
        #expect(!bytes.isEmpty && bytes.count <= 16 << 20)
    }

    @Test("One label made of a single grapheme cluster, up to 320 kB, is cut to the limit in well under a second")
    func graphemeCutTime() {
        for scalars in [10_000, 40_000, 160_000] {
            let label = "a" + String(repeating: "\u{301}", count: scalars)
            let file = FatalReportFile(Self.event(activities: [label]))
            let clock = ContinuousClock()
            var bytes: [UInt8] = []
            let elapsed = clock.measure { bytes = file.encodedWithinLimit(4096 * 2) }
            #expect(!bytes.isEmpty && bytes.count <= 4096 * 2, "\(bytes.count) bytes for a limit of 8,192")
            #expect(FatalReportFile.decode(bytes) != nil, "the cut report does not decode")
            // A generous bound: a debug build on a busy machine.
            #expect(elapsed < .seconds(10), "cutting \(scalars * 2 + 1) bytes in one cluster took \(elapsed)")
        }
    }

    @Test("A custom target whose name is 17 MB: the report is still written (cut), not dropped")
    func hugeTargetName() {
        let directory = Self.freshDirectory("target")
        let path = directory + "/report.json"
        let event = Self.event(target: String(repeating: "t", count: 17 << 20))
        let bytes = FatalReportFile(event).encodedWithinLimit()
        let writer = FatalReportWriter(path: path)
        writer.write(event)
        writer.flush()
        print("target: encoded \(bytes.count) bytes, report written: \(Self.exists(path))")
        #expect(Self.exists(path), "no report at all for a stall of a target with a long name")
    }

    // MARK: Promise 4: profiles and exports

    static func recorderProfile(_ stacks: [[String]]) -> StallProfile {
        var recorder = ProfileRecorder()
        for (time, names) in stacks.enumerated() {
            let frames = names.reversed().enumerated().map { index, name in
                StackFrame(
                    address: UInt(0x1000 + name.hashValue & 0xffff) &+ UInt(index) * 0x100_000,
                    function: name, file: nil, line: nil, image: "x", isUncertain: false)
            }
            recorder.add(frames, at: Int64(time) * 10_000_000)
        }
        return recorder.profile(interval: 10_000_000)
    }

    @Test("Stacks sum to sampleCount; callTree root is all samples; 1000-deep recursion; empty and single sample")
    func profileInvariants() {
        let deep = Array(repeating: "recurse", count: 1000)
        let shapes: [[[String]]] = [
            [],
            [["main", "f"]],
            [deep, deep + ["leaf"], ["main"]],
            [[], ["main"], []],
            [["a;b", "c\nd", "e\"<&>'", "\u{FFFD}\u{1}"], ["a;b"]],
        ]
        for shape in shapes {
            let profile = Self.recorderProfile(shape)
            let sum = profile.stacks.reduce(0) { $0 + $1.samples }
            let tree = profile.callTree
            print(
                "profile: samples \(profile.sampleCount) stacks sum \(sum) root \(tree.samples) folded: \(profile.foldedStacks().debugDescription.prefix(200))"
            )
            #expect(sum == profile.sampleCount)
            #expect(tree.samples == profile.sampleCount)
            for line in profile.foldedStacks().split(separator: "\n", omittingEmptySubsequences: false).dropLast() {
                let frames = line[..<(line.lastIndex(of: " ") ?? line.startIndex)]
                #expect(!frames.isEmpty, "a folded line without frames: \(line.debugDescription)")
            }
        }
    }

    @Test("speedscope JSON: required fields, weights in ms, sum = endValue, indices in frames")
    func speedscope() throws {
        for shape in [[], [["main"]], [["main", "a"], ["main", "b"], ["main", "a"]]] as [[[String]]] {
            let profile = Self.recorderProfile(shape)
            let json = profile.speedscopeJSON(title: "t\"<&\n")
            let object = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
            let profiles = object?["profiles"] as? [[String: Any]]
            let frames = (object?["shared"] as? [String: Any])?["frames"] as? [[String: Any]]
            #expect(object?["$schema"] as? String == "https://www.speedscope.app/file-format-schema.json")
            #expect(profiles?.count == 1)
            let first = profiles?.first
            let samples = first?["samples"] as? [[Int]] ?? []
            let weights = first?["weights"] as? [Double] ?? []
            #expect(samples.count == weights.count)
            #expect(samples.allSatisfy { $0.allSatisfy { (frames?.indices ?? 0..<0).contains($0) } })
            print("speedscope: \(json.prefix(400))")
        }
    }

    // MARK: Promise 4: stall-flamegraph

    static func runFlamegraph(_ input: [UInt8]) -> (status: Int32, signaled: Bool, out: String, err: String) {
        let binary = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/debug/stall-flamegraph").path
        let inputPath = "/tmp/attack-reports-\(getpid())-fg.folded"
        writeFile(inputPath, input)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = [inputPath]
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        do {
            try process.run()
        } catch {
            // Never read the pipes of a process that did not start: their write
            // ends are still open here, and the read would wait forever.
            Issue.record("could not run \(binary) (built by `swift build`): \(error)")
            return (-1, false, "", "")
        }
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (
            process.terminationStatus, process.terminationReason == .uncaughtSignal,
            String(decoding: outData, as: UTF8.self), String(decoding: errData, as: UTF8.self)
        )
    }

    /// Runs `command` with `/bin/sh -c` (as C's `system` does, on every
    /// platform); returns its exit status, -1 when it cannot start.
    static func shell(_ command: String) -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", command]
        guard (try? process.run()) != nil else { return -1 }
        process.waitUntilExit()
        return process.terminationStatus
    }

    static func isWellFormedXML(_ text: String) -> Bool {
        let path = "/tmp/attack-reports-\(getpid())-fg.svg"
        writeFile(path, Array(text.utf8))
        return Self.shell(
            "python3 -c 'import sys,xml.etree.ElementTree as E; E.parse(sys.argv[1])' \(path) 2>/dev/null") == 0
    }

    @Test("stall-flamegraph: counts summing past Int.max do not crash")
    func flamegraphOverflow() {
        let result = Self.runFlamegraph(Array("a;b 9223372036854775807\na;c 1\n".utf8))
        print(
            "flamegraph overflow: status \(result.status) signaled \(result.signaled) err \(result.err.prefix(300))"
        )
        #expect(!result.signaled)
    }

    @Test("stall-flamegraph: a stack 1 000 000 frames deep does not crash")
    func flamegraphDeep() {
        let line = Array(repeating: "f", count: 1_000_000).joined(separator: ";") + " 1\n"
        let result = Self.runFlamegraph(Array(line.utf8))
        print(
            "flamegraph deep: status \(result.status) signaled \(result.signaled) err \(result.err.suffix(300))")
        #expect(!result.signaled)
    }

    @Test("stall-flamegraph: names with control characters, quotes, <, & and invalid UTF-8 give well-formed SVG")
    func flamegraphNames() {
        var input = Array("main;a\u{1}b;\"q\" <x> & y 3\n".utf8)
        input += [0xff, 0xfe] + Array(";z\u{FFFF} 2\n".utf8)
        let result = Self.runFlamegraph(input)
        let wellFormed = Self.isWellFormedXML(result.out)
        print("flamegraph names: status \(result.status) well-formed XML: \(wellFormed)")
        #expect(result.status == 0 && wellFormed)
    }

    @Test("stall-flamegraph: a CRLF folded file is drawn, not rejected")
    func flamegraphCRLF() {
        let result = Self.runFlamegraph(Array("main;a 3\r\nmain;b 2\r\n".utf8))
        print("flamegraph CRLF: status \(result.status) err \(result.err.prefix(200).debugDescription)")
        #expect(result.status == 0)
    }

    @Test("stall-flamegraph: the folded stacks of a profile with an empty stack load without a bad line")
    func flamegraphEmptyStack() {
        let profile = Self.recorderProfile([[], ["main", "f"]])
        let result = Self.runFlamegraph(Array(profile.foldedStacks().utf8))
        print(
            "flamegraph empty stack: folded \(profile.foldedStacks().debugDescription) status \(result.status) err \(result.err.debugDescription)"
        )
        #expect(result.err.isEmpty)
    }
}

// MARK: Promise 1: no report appears after stop() returned (a real detector)

@Suite(
    "Fatal stall reports: stop() racing a stall's .started (real time)", .serialized,
    .disabled(if: underThreadSanitizer, "real-time offsets do not hold under ThreadSanitizer"))
struct FatalReportStopRaceTests {
    @inline(never)
    static func recurse(_ depth: Int, until deadline: ContinuousClock.Instant) -> Int {
        if depth > 0 { return recurse(depth - 1, until: deadline) &+ 1 }
        while ContinuousClock.now < deadline {}
        return 0
    }

    /// Blocks `queue` for `duration` in a recursion 300 deep; returns at once.
    static func block(_ queue: DispatchQueue, for duration: Duration) {
        let deadline = ContinuousClock.now + duration
        queue.async { _ = recurse(300, until: deadline) }
    }

    /// One trial: a first stall (so that the next is sampled early), then a second
    /// one during which stop() is called `offset` after the block began. Returns
    /// whether the file exists 300 ms after stop() returned, and when the report
    /// appeared (for calibration, without a stop).
    static func trial(offset: Duration?, path: String) -> (leaked: Bool, appeared: Duration?) {
        unlink(path)
        let queue = DispatchQueue(label: "attack-stop-race")
        let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(30), fatalReportPath: path)
        detector.start()
        block(queue, for: .milliseconds(80))
        Thread.sleep(forTimeInterval: 0.25)
        let start = ContinuousClock.now
        block(queue, for: .milliseconds(400))
        guard let offset else {
            var appeared: Duration?
            while ContinuousClock.now - start < .milliseconds(400) {
                if FatalReportFileEdgeCaseTests.exists(path) {
                    appeared = ContinuousClock.now - start
                    break
                }
            }
            detector.stop()
            return (false, appeared)
        }
        while ContinuousClock.now - start < offset {}
        detector.stop()
        Thread.sleep(forTimeInterval: 0.3)
        let leaked = FatalReportFileEdgeCaseTests.exists(path)
        queue.sync {}
        return (leaked, nil)
    }

    @Test("stop() during a stall's .started: no report exists 300 ms after stop() returned")
    func stopRace() {
        let directory = FatalReportFileEdgeCaseTests.freshDirectory("stop-race")
        let path = directory + "/report.json"
        var appeared: [Duration] = []
        for _ in 0..<5 { if let time = Self.trial(offset: nil, path: path).appeared { appeared.append(time) } }
        print("stop race: report appears after \(appeared)")
        guard let earliest = appeared.min() else { return }
        var leaks: [Duration] = []
        var trials = 0
        // 30 offsets 0.4 ms apart around the moment the report appears (a
        // sixth of such trials left a report before stop() closed the writer).
        for step in 0..<30 {
            let offset = earliest - .milliseconds(12) + .microseconds(step * 400)
            trials += 1
            if Self.trial(offset: offset, path: path).leaked { leaks.append(offset) }
        }
        print("stop race: \(leaks.count) of \(trials) trials left a report after stop(); offsets \(leaks)")
        #expect(leaks.isEmpty)
        unlink(path)
    }
}
