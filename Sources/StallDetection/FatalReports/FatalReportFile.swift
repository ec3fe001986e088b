#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

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
        /// Absent in files written before awaiting callers were reported.
        var awaiting: Bool?
    }

    struct Backtrace: Codable {
        var frames: [Frame]
        var threadID: UInt64?
        var unavailableReason: String?
        var omittedFrameCount: Int
        var omittedIndex: Int?
        var truncated: Bool
        var awaitsCut: String?
        /// The blocked thread's task, then its parents; absent in files
        /// written before tasks were reported, and for a thread running none.
        var tasks: [Task]?
        var parentTasksCut: String?
    }

    /// A ``StallTask``.
    struct Task: Codable {
        var id: UInt64
        var name: String?
        var priority: UInt8
        var basePriority: UInt8
        var relation: String

        init(_ task: StallTask) {
            (id, name, relation) = (task.id, task.name, task.relation.rawValue)
            (priority, basePriority) = (task.priority.rawValue, task.basePriority.rawValue)
        }

        /// The task, or nil for a relation this version does not know.
        var restored: StallTask? {
            StallTask.Relation(rawValue: relation).map {
                StallTask(
                    id: id, name: name, priority: TaskPriority(rawValue: priority),
                    basePriority: TaskPriority(rawValue: basePriority), relation: $0)
            }
        }
    }

    struct Function: Codable {
        var name: String
        var file: String?
        var line: Int?
        var image: String?
        var samples: Int
    }

    struct Stack: Codable {
        var functions: [Int]
        var samples: Int
    }

    struct Profile: Codable {
        var sampleCount: Int
        var intervalNanoseconds: Int64
        var spanNanoseconds: Int64
        var functions: [Function]
        /// The call tree's stacks (positions in `functions`, root first); nil in
        /// a report cut to fit.
        var stacks: [Stack]?
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
    /// What the writer cut to keep the report under ``maximumBytes``; nil when
    /// nothing was cut.
    var truncation: String?

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
                    uncertain: $0.isUncertain, inlined: $0.isInlined, awaiting: $0.isAwaiting ? true : nil)
            }, threadID: trace.threadID, unavailableReason: trace.unavailableReason,
            omittedFrameCount: trace.omittedFrameCount, omittedIndex: trace.omittedIndex, truncated: trace.isTruncated,
            awaitsCut: trace.awaitsCut, tasks: trace.task.map { ([$0] + trace.parentTasks).map(Task.init) },
            parentTasksCut: trace.parentTasksCut)
        profile = Profile(
            sampleCount: event.profile.sampleCount,
            intervalNanoseconds: Monotonic.nanoseconds(event.profile.interval),
            spanNanoseconds: Monotonic.nanoseconds(event.profile.span),
            functions: event.profile.functions.map {
                Function(name: $0.name, file: $0.file, line: $0.line, image: $0.image, samples: $0.samples)
            }, stacks: event.profile.stacks.map { Stack(functions: $0.functionIndices, samples: $0.samples) })
        activities = event.activities
        truncation = event.truncationNote
    }

    func encoded() -> [UInt8] {
        guard let data = try? JSONEncoder().encode(self) else { return [] }
        return Array(data)
    }

    /// The longest an activity label is kept when a report would exceed
    /// ``maximumBytes``.
    static let activityLabelLimit = 4096

    /// The encoded report, never larger than `limit` (by default what the reader
    /// takes), or empty when it cannot be made to fit. Cut in order of
    /// importance, least first, until it fits: a target name and activity labels
    /// longer than ``activityLabelLimit`` bytes are shortened, then the call tree goes, then
    /// the profile keeps fewer of its least-sampled functions, then the
    /// innermost activities go;
    /// ``truncation`` says what was cut. The stack is never cut.
    func encodedWithinLimit(_ limit: Int = maximumBytes) -> [UInt8] {
        var encoded = encoded()
        guard encoded.count > limit else { return encoded }
        var file = self
        var notes: [String] = []
        if file.target.utf8.count > Self.activityLabelLimit {
            file.target = Self.shortened(file.target)
            notes.append("the target's name cut to \(Self.activityLabelLimit) bytes")
        }
        let shortened = file.shortenActivityLabels()
        if shortened > 0 { notes.append("\(shortened) activity labels cut to \(Self.activityLabelLimit) bytes") }
        file.truncation = notes.isEmpty ? nil : notes.joined(separator: "; ")
        encoded = file.encoded()
        if encoded.count > limit, file.profile.stacks?.isEmpty == false {
            file.profile.stacks = nil
            notes.append("profile: call tree left out")
            file.truncation = notes.joined(separator: "; ")
            encoded = file.encoded()
        }
        let functions = file.profile.functions.count
        while encoded.count > limit, !file.profile.functions.isEmpty {
            file.profile.functions.removeLast((file.profile.functions.count + 1) / 2)
            file.truncation = (notes + [file.droppedFunctions(of: functions)]).joined(separator: "; ")
            encoded = file.encoded()
        }
        if file.profile.functions.count < functions { notes.append(file.droppedFunctions(of: functions)) }
        let activities = file.activities.count
        while encoded.count > limit, !file.activities.isEmpty {
            file.activities.removeLast()
            file.truncation = (notes + ["\(activities - file.activities.count) innermost activities left out"])
                .joined(separator: "; ")
            encoded = file.encoded()
        }
        return encoded.count <= limit ? encoded : []
    }

    /// Cuts every activity label longer than ``activityLabelLimit`` bytes,
    /// saying how much is missing; returns how many it cut.
    private mutating func shortenActivityLabels() -> Int {
        var shortened = 0
        activities = activities.map { label in
            guard label.utf8.count > Self.activityLabelLimit else { return label }
            shortened += 1
            return Self.shortened(label)
        }
        return shortened
    }

    /// `text` cut to ``activityLabelLimit`` bytes between two Unicode scalars,
    /// saying how many bytes are missing.
    private static func shortened(_ text: String) -> String {
        let kept = FatalReportFiles.prefix(of: text, bytes: activityLabelLimit)
        return kept + "… [\(text.utf8.count - kept.utf8.count) bytes cut]"
    }

    private func droppedFunctions(of total: Int) -> String {
        "profile: \(total - profile.functions.count) of \(total) functions left out (the least sampled)"
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
            && (profile.stacks ?? []).allSatisfy { stack in
                stack.samples > 0 && stack.samples <= profile.sampleCount
                    && stack.functions.count <= StallProfile.maximumStackDepth
                    && stack.functions.allSatisfy { profile.functions.indices.contains($0) }
            }
            && (profile.stacks ?? []).reduce(0) { $0 + $1.samples } <= profile.sampleCount
    }

    var event: StallEvent {
        let frames = backtrace.frames.map {
            StackFrame(
                address: UInt(truncatingIfNeeded: $0.address), function: $0.function, file: $0.file, line: $0.line,
                image: $0.image, isUncertain: $0.uncertain, isInlined: $0.inlined, isAwaiting: $0.awaiting ?? false)
        }
        var trace = StallBacktrace(
            restoring: frames, threadID: backtrace.threadID, unavailableReason: backtrace.unavailableReason,
            omittedFrameCount: backtrace.omittedFrameCount, omittedIndex: backtrace.omittedIndex,
            isTruncated: backtrace.truncated, awaitsCut: backtrace.awaitsCut)
        let tasks = (backtrace.tasks ?? []).compactMap(\.restored)
        trace.task = tasks.first
        trace.parentTasks = Array(tasks.dropFirst())
        trace.parentTasksCut = backtrace.parentTasksCut
        let restored = StallProfile(
            sampleCount: profile.sampleCount,
            functions: profile.functions.map {
                StallProfile.Function(name: $0.name, file: $0.file, line: $0.line, image: $0.image, samples: $0.samples)
            }, interval: .nanoseconds(profile.intervalNanoseconds), span: .nanoseconds(profile.spanNanoseconds),
            stacks: (profile.stacks ?? []).map {
                StallProfile.Stack(functionIndices: $0.functions, samples: $0.samples)
            })
        return StallEvent(
            id: id, phase: .started, duration: .nanoseconds(durationNanoseconds),
            threshold: .nanoseconds(thresholdNanoseconds), target: target, backtrace: trace,
            samplingTime: .nanoseconds(samplingTimeNanoseconds), profile: restored, activities: activities,
            endedWithProcess: true, truncationNote: truncation)
    }
}

extension StallBacktrace {
    /// A backtrace exactly as it was written (no cap applied again).
    init(
        restoring frames: [StackFrame], threadID: UInt64?, unavailableReason: String?, omittedFrameCount: Int,
        omittedIndex: Int?, isTruncated: Bool, awaitsCut: String?
    ) {
        self.frames = frames
        self.threadID = threadID
        self.unavailableReason = unavailableReason
        self.omittedFrameCount = omittedFrameCount
        self.omittedIndex = omittedIndex
        self.isTruncated = isTruncated
        self.awaitsCut = awaitsCut
    }
}
