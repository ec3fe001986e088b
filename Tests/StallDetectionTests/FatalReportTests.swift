import Foundation
import Testing

@testable import StallDetection

/// The fatal report file: written whole or not at all, read back once, and
/// anything else at its path is nil and removed, never a crash.
@Suite("Fatal stall reports (files)")
struct FatalReportTests {
    static func temporaryPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("stall-\(UUID()).json").path
    }

    static let event: StallEvent = {
        var recorder = ProfileRecorder()
        let frames = [
            StackFrame(
                address: 0x55a0, function: "loadEverything()", file: "/src/Feed.swift", line: 88, image: "App",
                isUncertain: false),
            StackFrame(address: 0x55b0, function: nil, file: nil, line: nil, image: nil, isUncertain: true),
            StackFrame(
                address: 0x7f00, function: "start_thread", file: nil, line: nil, image: "libc.so.6", isUncertain: false,
                isInlined: false),
        ]
        for index in 0..<10 { recorder.add(frames, at: Int64(index) * 10_000_000) }
        var backtrace = StallBacktrace(frames: frames, threadID: 4242, unavailableReason: nil, isTruncated: true)
        backtrace.task = StallTask(
            id: 9, name: nil, priority: .high, basePriority: .medium, relation: .taskGroupChild)
        backtrace.parentTasks = [
            StallTask(id: 3, name: "GET /feed", priority: .high, basePriority: .high, relation: .topLevel)
        ]
        return StallEvent(
            id: 7, phase: .started, duration: .milliseconds(640), threshold: .milliseconds(250), target: "main queue",
            backtrace: backtrace,
            samplingTime: .microseconds(150), profile: recorder.profile(interval: 10_000_000),
            activities: ["screen: Feed", "refresh"])
    }()

    func write(_ bytes: [UInt8], to path: String) {
        _ = FileManager.default.createFile(atPath: path, contents: Data(bytes))
    }

    func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    @Test("a report written by the writer reads back with every field, once; the file is gone afterwards")
    func roundTrip() throws {
        let path = Self.temporaryPath()
        let writer = FatalReportWriter(path: path)
        writer.write(Self.event)
        writer.flush()
        #expect(exists(path))
        #expect(!exists(path + ".tmp"), "no temporary file is left")
        let read = try #require(StallDetector.takeFatalStallReport(at: path))
        #expect(!exists(path))
        #expect(StallDetector.takeFatalStallReport(at: path) == nil)
        let original = Self.event
        #expect(read.id == original.id && read.phase == .started && read.endedWithProcess)
        #expect(read.duration == original.duration && read.threshold == original.threshold)
        #expect(read.target == original.target && read.samplingTime == original.samplingTime)
        #expect(read.backtrace.frames == original.backtrace.frames)
        #expect(read.backtrace.threadID == 4242 && read.backtrace.isTruncated)
        #expect(read.backtrace.task == original.backtrace.task && read.backtrace.task != nil)
        #expect(read.backtrace.parentTasks == original.backtrace.parentTasks && read.backtrace.parentTasksCut == nil)
        #expect(read.profile == original.profile)
        #expect(read.activities == ["screen: Feed", "refresh"])
        let text = String(describing: read)
        #expect(text.hasPrefix("Stall #7 never ended: main queue was blocked for at least 0.640 s"), "\(text)")
        #expect(text.contains("loadEverything() at /src/Feed.swift:88"), "\(text)")
        #expect(text.contains("where the time went (10 samples"), "\(text)")
    }

    @Test("the latest write wins; a removal after writes leaves no file, and drops a write still pending")
    func writerOrdering() {
        let path = Self.temporaryPath()
        let writer = FatalReportWriter(path: path)
        for duration in [300, 550, 800] {
            writer.write(Self.event.inProgress(duration: Int64(duration) * 1_000_000, profile: .empty))
        }
        writer.flush()
        let read = StallDetector.takeFatalStallReport(at: path)
        #expect(read?.duration == .milliseconds(800))
        writer.write(Self.event)
        writer.remove()
        writer.flush()
        #expect(!exists(path))
        writer.remove()  // idempotent, no file
        writer.flush()
        #expect(!exists(path))
    }

    @Test("no file: nil")
    func missing() {
        #expect(StallDetector.takeFatalStallReport(at: Self.temporaryPath()) == nil)
        #expect(StallDetector.takeFatalStallReport(at: "") == nil)
        #expect(StallDetector.takeFatalStallReport(at: "/nonexistent/dir/report.json") == nil)
    }

    @Test("empty, corrupt, foreign, other-version or insane files: nil, and removed", arguments: 0..<7)
    func notAReport(kind: Int) throws {
        let path = Self.temporaryPath()
        let valid = FatalReportFile(Self.event).encoded()
        let text = String(decoding: valid, as: UTF8.self)
        let contents: [UInt8]
        switch kind {
        case 0: contents = []
        case 1: contents = (0..<4096).map { _ in UInt8.random(in: 0...255) }
        case 2: contents = Array(#"{"crash":"report","frames":[1,2,3]}"#.utf8)
        case 3: contents = Array(text.replacingOccurrences(of: "\"version\":1", with: "\"version\":2").utf8)
        case 4:
            contents = Array(
                text.replacingOccurrences(of: "\"durationNanoseconds\":", with: "\"durationNanoseconds\":-").utf8)
        case 5:
            contents = Array(
                text.replacingOccurrences(of: "\"omittedFrameCount\":0", with: "\"omittedFrameCount\":-3").utf8)
        default: contents = Array("\u{FEFF}not json at all \u{0}\u{1}".utf8)
        }
        #expect(contents != valid || kind == 0)
        write(contents, to: path)
        #expect(StallDetector.takeFatalStallReport(at: path) == nil)
        #expect(!exists(path), "removed")
    }

    @Test("every truncation of a valid report: nil and removed, never a crash")
    func truncated() {
        let path = Self.temporaryPath()
        let valid = FatalReportFile(Self.event).encoded()
        #expect(valid.count > 500)
        for length in Swift.stride(from: 0, to: valid.count, by: max(1, valid.count / 200)) {
            write(Array(valid.prefix(length)), to: path)
            #expect(StallDetector.takeFatalStallReport(at: path) == nil, "length \(length)")
            #expect(!exists(path))
        }
        write(valid, to: path)
        #expect(StallDetector.takeFatalStallReport(at: path) != nil)
    }

    @Test("a file larger than 16 MB is not read: nil, and removed")
    func huge() {
        let path = Self.temporaryPath()
        write([UInt8](repeating: 0x20, count: FatalReportFile.maximumBytes + 10), to: path)
        #expect(StallDetector.takeFatalStallReport(at: path) == nil)
        #expect(!exists(path))
    }

    @Test("a directory at the path: nil, and left alone")
    func directory() throws {
        let path = Self.temporaryPath()
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: path) }
        #expect(StallDetector.takeFatalStallReport(at: path) == nil)
        var isDirectory: ObjCBool = false
        #expect(FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) && isDirectory.boolValue)
    }

    @Test("a FIFO at the path: nil at once (no blocking open), and removed; a symbolic link: removed, its target kept")
    func fifoAndLink() throws {
        let path = Self.temporaryPath()
        #expect(mkfifo(path, 0o600) == 0)
        #expect(StallDetector.takeFatalStallReport(at: path) == nil)
        #expect(!exists(path))
        let target = Self.temporaryPath()
        write(Array("not a report".utf8), to: target)
        defer { unlink(target) }
        #expect(symlink(target, path) == 0)
        #expect(StallDetector.takeFatalStallReport(at: path) == nil)
        #expect(!exists(path) && exists(target))
    }

    @Test("a writer whose directory does not exist writes nothing and does not crash")
    func unwritable() {
        let writer = FatalReportWriter(path: "/nonexistent-\(UUID())/report.json")
        writer.write(Self.event)
        writer.remove()
        writer.flush()
    }
}

extension StallDetectorInProcessTests {
    @Test(
        "with fatalReportPath, the report exists while a stall lasts and is gone once it ends",
        .disabled(if: underThreadSanitizer, "real-time bounds do not hold under ThreadSanitizer"))
    func fatalReportLifecycle() async {
        let path = FatalReportTests.temporaryPath()
        defer { unlink(path) }
        let queue = DispatchQueue(label: "test.fatal")
        let detector = StallDetector(
            target: .queue(queue), threshold: .milliseconds(100), heartbeat: .milliseconds(10),
            reportsWhileDebugged: true, fatalReportPath: path, isTraced: { false })
        detector.start()
        usleep(100_000)
        let seen = Locked<(during: StallEvent?, existed: Bool)>((nil, false))
        queue.sync {
            // The report is written at .started (about 100 ms in on a quiet
            // machine) and rewritten every 250 ms; peek at it without removing
            // it. The stall lasts 600 ms, and longer until the report was seen
            // (a machine at load 7 gave the detector no time within 600 ms),
            // 20 s at most.
            let start = ContinuousClock.now
            while ContinuousClock.now - start < .milliseconds(600)
                || (!seen.withLock { $0.existed } && ContinuousClock.now - start < .seconds(20))
            {
                usleep(20_000)
                if access(path, F_OK) == 0, let data = FileManager.default.contents(atPath: path),
                    let file = FatalReportFile.decode(Array(data))
                {
                    seen.withLock { $0 = (file.event, true) }
                }
            }
        }
        // .ended removes it (on the writer's queue, right after).
        let deadline = ContinuousClock.now + .seconds(2)
        while access(path, F_OK) == 0 && ContinuousClock.now < deadline { usleep(5_000) }
        #expect(access(path, F_OK) != 0, "removed at .ended")
        let (during, existed) = seen.withLock { $0 }
        #expect(existed, "written while the stall lasted")
        #expect((during.map { milliseconds($0.duration) } ?? 0) >= 100, "\(String(describing: during))")
        #expect(during?.endedWithProcess == true && during?.phase == .started)
        detector.stop()
        for await _ in detector.events {}
    }
}

extension StallDetectorInProcessTests {
    /// Runs under ThreadSanitizer too (no timing is checked): the profiler's
    /// samples, the fatal report's writes and removal, answers ending sessions and
    /// `stop()` racing a sample.
    @Test("stalls with profiling and a fatal report, then stop() mid-stall: events pair up, no file is left")
    func profilingRaces() async {
        let path = FatalReportTests.temporaryPath()
        defer { unlink(path) }
        let queue = DispatchQueue(label: "test.races")
        let detector = StallDetector(
            target: .queue(queue), threshold: .milliseconds(30), heartbeat: .milliseconds(5),
            reportsWhileDebugged: true, fatalReportPath: path, isTraced: { false })
        detector.start()
        for length in [10, 60, 200, 5, 120] {
            queue.sync {
                StallDetector.withActivity("block \(length)") { _ = usleep(UInt32(length) * 1000) }
            }
            usleep(20_000)
        }
        // Stopped while a stall (and its sampling) is going on.
        queue.async { _ = usleep(300_000) }
        usleep(150_000)
        detector.stop()
        var events: [StallEvent] = []
        for await event in detector.events { events.append(event) }
        var open: UInt64?
        for event in events {
            switch event.phase {
            case .started:
                #expect(open == nil)
                open = event.id
            case .ended:
                #expect(open == event.id)
                open = nil
                #expect(event.profile.sampleCount <= StallProfile.maximumSampleCount)
            }
        }
        queue.sync {}
        #expect(access(path, F_OK) != 0, "stop() removes the report")
    }
}
