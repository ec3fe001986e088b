import Foundation
import Testing

@testable import StallDetection

/// The fatal report in a directory another user can write to: whatever that
/// user plants (a symbolic link, a file of theirs held open, a FIFO), the
/// report is written, only its owner can read it, nothing else is written and
/// nothing blocks. Run as root, the planting user is `nobody` (via `setpriv`);
/// otherwise the planted objects are this user's.
@Suite("Fatal stall reports (hostile directories)")
struct FatalReportSafetyTests {
    /// A world-writable directory without the sticky bit (so that the kernel's
    /// protected_symlinks and protected_fifos do not apply: the writer alone
    /// must be safe), removed with its contents afterwards.
    final class SharedDirectory {
        let path: String
        init() throws {
            path = FileManager.default.temporaryDirectory.appendingPathComponent("shared-\(UUID())").path
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
            chmod(path, 0o777)
        }
        deinit { try? FileManager.default.removeItem(atPath: path) }

        var entries: [String] { (try? FileManager.default.contentsOfDirectory(atPath: path))?.sorted() ?? [] }
    }

    static let attackerRunsAsNobody = getuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0

    /// Runs `script` as the other user (`nobody` when this is root).
    static func asOtherUser(_ script: String) throws {
        let process = Process()
        if attackerRunsAsNobody {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c", script]
        } else {
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", script]
        }
        try process.run()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "\(script)")
    }

    static func status(_ path: String) -> stat? {
        var result = stat()
        return lstat(path, &result) == 0 ? result : nil
    }

    static func contents(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Waits for the writer at most 10 s; when it is stuck, opens `fifos` for
    /// reading so that it goes on (the test fails, but ends).
    static func flush(_ writer: FatalReportWriter, unblocking fifos: [String]) -> Bool {
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            writer.flush()
            done.signal()
        }
        guard done.wait(timeout: .now() + 10) == .timedOut else { return true }
        let readers = fifos.map { open($0, O_RDONLY | O_NONBLOCK) }
        _ = done.wait(timeout: .now() + 10)
        for reader in readers where reader >= 0 { close(reader) }
        return false
    }

    @Test("a symbolic link planted at the report's old temporary name or at the report: its target is never written")
    func plantedLinks() throws {
        let shared = try SharedDirectory()
        let victim = FatalReportTests.temporaryPath()
        try "victim's data".write(toFile: victim, atomically: false, encoding: .utf8)
        defer { unlink(victim) }
        let path = shared.path + "/report.json"
        try Self.asOtherUser("ln -s '\(victim)' '\(path).tmp'")
        let writer = FatalReportWriter(path: path)
        writer.write(FatalReportTests.event)
        writer.flush()
        #expect(Self.contents(victim) == "victim's data")
        #expect(StallDetector.takeFatalStallReport(at: path)?.id == FatalReportTests.event.id)
        try Self.asOtherUser("ln -s '\(victim)' '\(path)'")
        writer.write(FatalReportTests.event)
        writer.flush()
        #expect(Self.contents(victim) == "victim's data")
        #expect(Self.status(path).map { $0.st_mode & S_IFMT } == S_IFREG, "the link is replaced, not followed")
        #expect(StallDetector.takeFatalStallReport(at: path)?.id == FatalReportTests.event.id)
    }

    @Test(
        "a file planted by another user (mode 0666, held open) sees nothing of the report; the report is 0600, the writer's"
    )
    func plantedFile() throws {
        let shared = try SharedDirectory()
        let path = shared.path + "/report.json"
        try Self.asOtherUser("touch '\(path).tmp' '\(path)' && chmod 666 '\(path).tmp' '\(path)'")
        let held = [open(path + ".tmp", O_RDONLY), open(path, O_RDONLY)]
        defer { for descriptor in held { close(descriptor) } }
        let writer = FatalReportWriter(path: path)
        writer.write(FatalReportTests.event)
        writer.flush()
        for descriptor in held {
            var byte: UInt8 = 0
            #expect(descriptor >= 0 && read(descriptor, &byte, 1) == 0, "the other user's open file stays empty")
        }
        let report = try #require(Self.status(path))
        #expect(report.st_uid == getuid(), "the report is the writer's file, not the planted one")
        #expect(report.st_mode & 0o777 == 0o600)
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
    }

    @Test("a FIFO planted at the report's old temporary name and at the report: the write neither blocks nor is lost")
    func plantedFifos() throws {
        let shared = try SharedDirectory()
        let path = shared.path + "/report.json"
        try Self.asOtherUser("mkfifo -m 666 '\(path).tmp' '\(path)'")
        let writer = FatalReportWriter(path: path)
        writer.write(FatalReportTests.event)
        #expect(Self.flush(writer, unblocking: [path + ".tmp", path]), "the writer blocked on a FIFO")
        #expect(Self.status(path).map { $0.st_mode & S_IFMT } == S_IFREG)
        #expect(StallDetector.takeFatalStallReport(at: path)?.id == FatalReportTests.event.id)
        let removed = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            writer.write(FatalReportTests.event)
            writer.remove()
            removed.signal()
        }
        #expect(removed.wait(timeout: .now() + 10) == .success, "remove() waited")
        #expect(Self.flush(writer, unblocking: [path + ".tmp"]))
        #expect(Self.status(path) == nil, "no report after a removal")
    }

    @Test(
        "a report whose name is 252 or 255 bytes long (its old temporary name would be too long) is written and taken back",
        arguments: [252, 255])
    func longName(length: Int) throws {
        let shared = try SharedDirectory()
        let name =
            String(repeating: "é", count: (length - 5) / 2) + String(repeating: "r", count: (length - 5) % 2) + ".json"
        #expect(name.utf8.count == length)
        let path = shared.path + "/" + name
        let writer = FatalReportWriter(path: path)
        writer.write(FatalReportTests.event)
        writer.flush()
        #expect(StallDetector.takeFatalStallReport(at: path)?.id == FatalReportTests.event.id)
    }

    @Test("writes, a removal and a take leave no temporary file; temporary names differ and have a fixed length")
    func noLeftovers() throws {
        let shared = try SharedDirectory()
        let path = shared.path + "/report.json"
        let writer = FatalReportWriter(path: path)
        for _ in 0..<20 { writer.write(FatalReportTests.event) }
        writer.flush()
        #expect(shared.entries == ["report.json"])
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
        #expect(shared.entries.isEmpty)
        writer.write(FatalReportTests.event)
        writer.remove()
        writer.flush()
        #expect(shared.entries.isEmpty)
        let names = (0..<100).map { _ in FatalReportFiles.temporaryName(for: "report.json") }
        #expect(Set(names).count == 100)
        #expect(names.allSatisfy { $0.hasPrefix(".report.json.") && $0.utf8.count == names[0].utf8.count })
        let long = String(repeating: "é", count: 127)
        #expect(FatalReportFiles.temporaryName(for: long).utf8.count == 1 + 200 + 1 + 32 + 4)
    }

    @Test(
        "taking a report removes the temporary files a killed writer left an hour ago; fresh ones, another user's and links stay"
    )
    func leftovers() throws {
        let shared = try SharedDirectory()
        let path = shared.path + "/report.json"
        let random = String(repeating: "a", count: 32)
        let mine = shared.path + "/.report.json." + random + ".tmp"
        let theirs = shared.path + "/.report.json." + String(repeating: "b", count: 32) + ".tmp"
        let link = shared.path + "/.report.json." + String(repeating: "c", count: 32) + ".tmp"
        let unrelated = shared.path + "/.report.json.short.tmp"
        #expect(FileManager.default.createFile(atPath: mine, contents: Data("half a rep".utf8)))
        let fresh = shared.path + "/.report.json." + String(repeating: "d", count: 32) + ".tmp"
        #expect(FileManager.default.createFile(atPath: fresh, contents: Data("a write in progress".utf8)))
        // Left behind a while ago (a write in progress is younger).
        var times = [timespec(tv_sec: time(nil) - 3_600, tv_nsec: 0), timespec(tv_sec: time(nil) - 3_600, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, mine, &times, 0) == 0)
        #expect(FileManager.default.createFile(atPath: unrelated, contents: nil))
        #expect(symlink(mine, link) == 0)
        if Self.attackerRunsAsNobody { try Self.asOtherUser("touch '\(theirs)'") }
        let writer = FatalReportWriter(path: path)
        writer.write(FatalReportTests.event)
        writer.flush()
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
        #expect(Self.status(mine) == nil, "this user's leftover is removed")
        #expect(Self.status(fresh) != nil, "a temporary file written a moment ago stays")
        #expect(Self.status(link) != nil && Self.status(unrelated) != nil, "a link and another name stay")
        if Self.attackerRunsAsNobody { #expect(Self.status(theirs) != nil, "another user's file stays") }
    }

    @Test("8 threads taking the same report at once: exactly one gets it, 40 times over")
    func takenOnce() throws {
        let shared = try SharedDirectory()
        let path = shared.path + "/report.json"
        var event = FatalReportTests.event
        event.activities = [String(repeating: "a", count: 1 << 20)]  // a read long enough for others to open it
        let bytes = FatalReportFile(event).encoded()
        for trial in 0..<40 {
            #expect(FileManager.default.createFile(atPath: path, contents: Data(bytes)))
            let taken = Locked(0)
            let start = DispatchSemaphore(value: 0)
            DispatchQueue.concurrentPerform(iterations: 8) { index in
                if index == 0 {
                    for _ in 1..<8 { start.signal() }
                } else {
                    start.wait()
                }
                if StallDetector.takeFatalStallReport(at: path) != nil { taken.withLock { $0 += 1 } }
            }
            #expect(taken.withLock { $0 } == 1, "trial \(trial)")
            #expect(shared.entries.isEmpty, "trial \(trial)")
        }
    }

    @Test("a 17 MB activity label and a huge profile: the report stays under 16 MB, reads back, and says what was cut")
    func cappedSize() throws {
        let shared = try SharedDirectory()
        let path = shared.path + "/report.json"
        let original = FatalReportTests.event
        var event = original
        event.activities = ["screen: Feed", String(repeating: "é", count: 17 << 19), "refresh"]
        let writer = FatalReportWriter(path: path)
        writer.write(event)
        writer.flush()
        let size = Self.status(path).map { Int($0.st_size) } ?? 0
        #expect(size > 0 && size <= FatalReportFile.maximumBytes)
        let read = try #require(StallDetector.takeFatalStallReport(at: path))
        #expect(read.activities.count == 3 && read.activities[0] == "screen: Feed" && read.activities[2] == "refresh")
        #expect(read.activities[1].hasPrefix("éé") && read.activities[1].hasSuffix("bytes cut]"))
        #expect(read.backtrace.frames == original.backtrace.frames)
        #expect(read.truncationNote?.contains("1 activity labels cut to 4096 bytes") == true)
        #expect(String(describing: read).contains("(report cut to fit: "))

        let functions = (0..<250_000).map {
            StallProfile.Function(
                name: "function\($0)" + String(repeating: "x", count: 80), file: nil, line: nil, image: nil,
                samples: max(1, StallProfile.maximumSampleCount - $0))
        }
        event.profile = StallProfile(
            sampleCount: StallProfile.maximumSampleCount, functions: functions, interval: .milliseconds(1),
            span: .seconds(8))
        writer.write(event)
        writer.flush()
        let big = try #require(StallDetector.takeFatalStallReport(at: path))
        #expect(big.profile.functions.count < functions.count && big.profile.functions.count > 0)
        #expect(big.profile.functions.first?.name == functions[0].name, "the most sampled functions are kept")
        #expect(
            big.truncationNote?.contains("functions left out (the least sampled)") == true,
            "\(big.truncationNote ?? "nil")")
        #expect(FatalReportFile(original).truncation == nil && original.truncationNote == nil)
    }
}
