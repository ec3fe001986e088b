import Dispatch

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension StallDetector {
    /// The report of a stall that was still going on when the process ended (it
    /// was killed, crashed or exited mid-stall), written by a detector created with
    /// `fatalReportPath: path`; nil when there is none. Reading removes the file.
    ///
    /// ```swift
    /// let path = cachesDirectory + "/stall-report.json"
    /// if let previous = StallDetector.takeFatalStallReport(at: path) {
    ///     upload(String(describing: previous))   // the stack, the profile so far, the activities
    /// }
    /// let detector = StallDetector(target: .mainQueue, threshold: .milliseconds(250), fatalReportPath: path)
    /// detector.start()
    /// ```
    ///
    /// The event has phase `.started`, ``StallEvent/endedWithProcess`` set, the
    /// stack sampled when the stall was detected, and the duration, profile and
    /// activities as last written (the file is refreshed a few times a second while
    /// a stall lasts). A file that is not such a report (corrupt, truncated, empty,
    /// written by something else, larger than 16 MB, a FIFO, a symbolic link)
    /// gives nil and is removed too (a directory is left alone); it never traps
    /// and never blocks. Call it before starting a detector with the same path.
    ///
    /// One path per detector: two detectors given the same path overwrite each
    /// other's report, and the first stall to end removes it.
    ///
    /// - Parameter path: The path given as `fatalReportPath`.
    /// - Returns: The stall the previous run died in, or nil.
    public static func takeFatalStallReport(at path: String) -> StallEvent? {
        // Not blocking on a FIFO (or a device) put at the path: only a regular
        // file is read. Anything else gives nil and is removed too, except a
        // directory, which is left alone.
        let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)
        guard descriptor >= 0 else {
            if errno == ELOOP { unlink(path) }  // a symbolic link: removed, its target untouched
            return nil
        }
        var status = stat()
        let kind = fstat(descriptor, &status) == 0 ? status.st_mode & S_IFMT : 0
        guard kind == S_IFREG else {
            let isDirectory = kind == S_IFDIR
            close(descriptor)
            if !isDirectory { unlink(path) }
            return nil
        }
        var bytes: [UInt8] = []
        var readable = true
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { systemReadFile(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 {
                readable = count == 0
                break
            }
            bytes += buffer.prefix(count)
            if bytes.count > FatalReportFile.maximumBytes {
                readable = false
                break
            }
        }
        close(descriptor)
        unlink(path)
        guard readable else { return nil }
        return FatalReportFile.decode(bytes)?.event
    }
}

#if canImport(Glibc)
private let systemReadFile = Glibc.read
private let systemWriteFile = Glibc.write
#elseif canImport(Darwin)
private let systemReadFile = Darwin.read
private let systemWriteFile = Darwin.write
#endif

/// Keeps one detector's fatal report file: written at `.started`, rewritten while
/// the stall lasts, removed at `.ended`.
///
/// Writes happen on a queue of their own (an `fsync` can take a while; the
/// detector's queue keeps sampling meanwhile) and coalesce: a write asked for
/// while another is pending replaces it. Each write goes to a temporary file
/// beside the report, is flushed to disk (`fsync`), then renamed over the report,
/// and the directory is flushed: the report on disk is always a whole one. A
/// removal is queued after the writes asked for before it, and drops a write still
/// pending.
final class FatalReportWriter: Sendable {
    let path: String
    private let queue = DispatchQueue(label: "StallDetector.fatalReport", qos: .utility)
    private let pending = Locked<(event: StallEvent?, scheduled: Bool)>((nil, false))

    init(path: String) {
        self.path = path
    }

    func write(_ event: StallEvent) {
        let schedule = pending.withLock { pending -> Bool in
            pending.event = event
            defer { pending.scheduled = true }
            return !pending.scheduled
        }
        guard schedule else { return }
        queue.async { [self] in
            let event = pending.withLock { pending -> StallEvent? in
                pending.scheduled = false
                defer { pending.event = nil }
                return pending.event
            }
            if let event { Self.writeAtomically(FatalReportFile(event).encoded(), to: path) }
        }
    }

    func remove() {
        pending.withLock { $0.event = nil }
        queue.async { [path] in _ = unlink(path) }
    }

    /// Waits until every write and removal asked for so far is done (tests).
    func flush() { queue.sync {} }

    /// Temporary file, `fsync`, `rename`, `fsync` of the directory.
    static func writeAtomically(_ bytes: [UInt8], to path: String) {
        let temporary = path + ".tmp"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { return }
        var written = 0
        while written < bytes.count {
            let count = bytes.withUnsafeBytes { raw in
                systemWriteFile(descriptor, raw.baseAddress! + written, raw.count - written)
            }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            written += count
        }
        let synced = fsync(descriptor) == 0
        close(descriptor)
        guard written == bytes.count, synced, rename(temporary, path) == 0 else {
            unlink(temporary)
            return
        }
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
        let directoryDescriptor = open(directory.isEmpty ? "/" : directory, O_RDONLY | O_CLOEXEC)
        if directoryDescriptor >= 0 {
            fsync(directoryDescriptor)
            close(directoryDescriptor)
        }
    }
}

extension StallEvent {
    /// This `.started` event with the duration and profile of a later moment of
    /// the same stall (the fatal report's refresh).
    func inProgress(duration: Int64, profile: StallProfile) -> StallEvent {
        StallEvent(
            id: id, phase: phase, duration: .nanoseconds(duration), threshold: threshold, target: target,
            backtrace: backtrace, samplingTime: samplingTime, profile: profile, activities: activities)
    }
}

/// The fatal report's file format: JSON with a format name and version, so that
/// any other file is recognised as foreign.
struct FatalReportFile: Codable {
    static let formatName = "SafeTimers.StallDetection.fatalStallReport"
    static let currentVersion = 1
    static let maximumBytes = 16 << 20

    struct Frame: Codable {
        var address: UInt64
        var function: String?
        var file: String?
        var line: Int?
        var image: String?
        var uncertain: Bool
        var inlined: Bool
    }

    struct Backtrace: Codable {
        var frames: [Frame]
        var threadID: UInt64?
        var unavailableReason: String?
        var omittedFrameCount: Int
        var omittedIndex: Int?
        var truncated: Bool
    }

    struct Function: Codable {
        var name: String
        var file: String?
        var line: Int?
        var image: String?
        var samples: Int
    }

    struct Profile: Codable {
        var sampleCount: Int
        var intervalNanoseconds: Int64
        var spanNanoseconds: Int64
        var functions: [Function]
    }

    var format: String
    var version: Int
    var id: UInt64
    var durationNanoseconds: Int64
    var thresholdNanoseconds: Int64
    var target: String
    var samplingTimeNanoseconds: Int64
    var backtrace: Backtrace
    var profile: Profile
    var activities: [String]

    init(_ event: StallEvent) {
        format = Self.formatName
        version = Self.currentVersion
        id = event.id
        durationNanoseconds = Monotonic.nanoseconds(event.duration)
        thresholdNanoseconds = Monotonic.nanoseconds(event.threshold)
        target = event.target
        samplingTimeNanoseconds = Monotonic.nanoseconds(event.samplingTime)
        let trace = event.backtrace
        backtrace = Backtrace(
            frames: trace.frames.map {
                Frame(
                    address: UInt64($0.address), function: $0.function, file: $0.file, line: $0.line, image: $0.image,
                    uncertain: $0.isUncertain, inlined: $0.isInlined)
            }, threadID: trace.threadID, unavailableReason: trace.unavailableReason,
            omittedFrameCount: trace.omittedFrameCount, omittedIndex: trace.omittedIndex, truncated: trace.isTruncated)
        profile = Profile(
            sampleCount: event.profile.sampleCount,
            intervalNanoseconds: Monotonic.nanoseconds(event.profile.interval),
            spanNanoseconds: Monotonic.nanoseconds(event.profile.span),
            functions: event.profile.functions.map {
                Function(name: $0.name, file: $0.file, line: $0.line, image: $0.image, samples: $0.samples)
            })
        activities = event.activities
    }

    func encoded() -> [UInt8] {
        guard let data = try? JSONEncoder().encode(self) else { return [] }
        return Array(data)
    }

    /// The report in `bytes`, or nil for anything that is not a whole, sane report
    /// of this format.
    static func decode(_ bytes: [UInt8]) -> FatalReportFile? {
        guard !bytes.isEmpty, let file = try? JSONDecoder().decode(FatalReportFile.self, from: Data(bytes)),
            file.format == formatName, file.version == currentVersion, file.isSane
        else { return nil }
        return file
    }

    /// Values a detector can have written: no negative durations or counts, an
    /// omission inside the frames, samples no more than the sample count.
    private var isSane: Bool {
        durationNanoseconds >= 0 && thresholdNanoseconds >= 0 && samplingTimeNanoseconds >= 0
            && backtrace.omittedFrameCount >= 0 && backtrace.frames.count <= StallBacktrace.maximumFrameCount
            && (backtrace.omittedIndex.map { $0 >= 0 && $0 <= backtrace.frames.count } ?? true)
            && profile.sampleCount >= 0 && profile.sampleCount <= StallProfile.maximumSampleCount + 1
            && profile.intervalNanoseconds >= 0 && profile.spanNanoseconds >= 0
            && profile.functions.allSatisfy { $0.samples >= 0 && $0.samples <= profile.sampleCount }
    }

    var event: StallEvent {
        let frames = backtrace.frames.map {
            StackFrame(
                address: UInt(truncatingIfNeeded: $0.address), function: $0.function, file: $0.file, line: $0.line,
                image: $0.image, isUncertain: $0.uncertain, isInlined: $0.inlined)
        }
        let trace = StallBacktrace(
            restoring: frames, threadID: backtrace.threadID, unavailableReason: backtrace.unavailableReason,
            omittedFrameCount: backtrace.omittedFrameCount, omittedIndex: backtrace.omittedIndex,
            isTruncated: backtrace.truncated)
        let restored = StallProfile(
            sampleCount: profile.sampleCount,
            functions: profile.functions.map {
                StallProfile.Function(name: $0.name, file: $0.file, line: $0.line, image: $0.image, samples: $0.samples)
            }, interval: .nanoseconds(profile.intervalNanoseconds), span: .nanoseconds(profile.spanNanoseconds))
        return StallEvent(
            id: id, phase: .started, duration: .nanoseconds(durationNanoseconds),
            threshold: .nanoseconds(thresholdNanoseconds), target: target, backtrace: trace,
            samplingTime: .nanoseconds(samplingTimeNanoseconds), profile: restored, activities: activities,
            endedWithProcess: true)
    }
}

extension StallBacktrace {
    /// A backtrace exactly as it was written (no cap applied again).
    init(
        restoring frames: [StackFrame], threadID: UInt64?, unavailableReason: String?, omittedFrameCount: Int,
        omittedIndex: Int?, isTruncated: Bool
    ) {
        self.frames = frames
        self.threadID = threadID
        self.unavailableReason = unavailableReason
        self.omittedFrameCount = omittedFrameCount
        self.omittedIndex = omittedIndex
        self.isTruncated = isTruncated
    }
}
