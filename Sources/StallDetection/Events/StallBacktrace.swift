import SafeTimers

/// The stack of a blocked thread, symbolicated.
///
/// Complete from the blocked function to the thread's start (`start_thread`,
/// `main`) whenever the stack could be read to its end: frames are never merged
/// or dropped, so a recursion 200 calls deep has 200 frames. The report prints a
/// run of identical frames on one line ("recurse(depth:) × 200"). A stack deeper
/// than ``maximumFrameCount`` keeps its innermost frames and its outermost ones,
/// and says how many are not shown.
public struct StallBacktrace: Sendable, CustomStringConvertible {
    /// The frames, innermost first. Empty when ``unavailableReason`` is set.
    public let frames: [StackFrame]
    /// The id of the sampled thread, when there was one: the kernel thread id
    /// (`gettid()`) on Linux. 64 bits wide so that one type also holds Darwin's
    /// `pthread_threadid_np` once Apple platforms sample stacks; nil there today.
    public let threadID: UInt64?
    /// Why there is no stack ("stack unavailable: …"), or nil.
    public let unavailableReason: String?
    /// How many frames between `frames[omittedIndex - 1]` and
    /// `frames[omittedIndex]` are not kept (a stack deeper than
    /// ``maximumFrameCount``); 0 when the stack is complete.
    public let omittedFrameCount: Int
    /// Where the omitted frames were, as an index into ``frames``; nil when none.
    public let omittedIndex: Int?
    /// Whether the stack copy ended before the thread's outermost frames, so that
    /// an unknown number of outer frames is missing.
    public let isTruncated: Bool
    /// Why the awaiting callers (``StackFrame/isAwaiting``) stop before the
    /// task's entry: a context that could not be read, a chain deeper than
    /// 1,024 awaits, or a thread that resumed other code before its awaits
    /// were read. Nil when they reach the task's entry, or the thread ran no
    /// async function.
    public let awaitsCut: String?

    /// The Swift task the thread was running when sampled, as the runtime
    /// records it (its name, priority, and whether it is a child of a task
    /// group or an `async let`); nil when the thread ran no task, or the task
    /// could not be read (``StallTask`` says where tasks are read).
    public internal(set) var task: StallTask?
    /// The parents of ``task``, innermost first: the task that made it, the
    /// task that made that one, up to a top-level task. Empty for a top-level
    /// task.
    public internal(set) var parentTasks: [StallTask] = []
    /// Why ``parentTasks`` stops before a top-level task (a parent that could
    /// not be read, more than 32 parents), or nil when it does not.
    public internal(set) var parentTasksCut: String?

    /// The most frames a backtrace keeps: the innermost 768 and the outermost 256.
    public static let maximumFrameCount = 1024

    /// Set when the thread was running but could not be sampled (it blocks the
    /// signal, or did not answer it): a profile counts such a sample as time in
    /// unknown code rather than dropping it.
    var whileRunning = false

    init(
        frames: [StackFrame], threadID: UInt64?, unavailableReason: String?, isTruncated: Bool = false,
        awaitsCut: String? = nil
    ) {
        self.threadID = threadID
        self.awaitsCut = awaitsCut
        self.unavailableReason = unavailableReason
        self.isTruncated = isTruncated
        if frames.count > Self.maximumFrameCount {
            let outer = Self.maximumFrameCount / 4
            let inner = Self.maximumFrameCount - outer
            self.frames = Array(frames.prefix(inner) + frames.suffix(outer))
            self.omittedFrameCount = frames.count - Self.maximumFrameCount
            self.omittedIndex = inner
        } else {
            self.frames = frames
            self.omittedFrameCount = 0
            self.omittedIndex = nil
        }
    }

    /// A backtrace that could not be captured, with the reason.
    public static func unavailable(_ reason: String, threadID: UInt64? = nil) -> StallBacktrace {
        StallBacktrace(frames: [], threadID: threadID, unavailableReason: reason)
    }

    /// A running thread that could not be sampled (see ``whileRunning``).
    static func unavailableWhileRunning(_ reason: String, threadID: UInt64?) -> StallBacktrace {
        var backtrace = StallBacktrace(frames: [], threadID: threadID, unavailableReason: reason)
        backtrace.whileRunning = true
        return backtrace
    }

    /// One frame a line, a run of identical frames (recursion) on one line with its
    /// count, a repeated group of up to 4 frames once with its count; "… N frames not shown" where frames were left out; "stack
    /// unavailable: <reason>" when there is none.
    public var description: String {
        if let unavailableReason { return "  stack unavailable: \(unavailableReason)" }
        var lines: [String] = []
        if let task {
            let parents = parentTasks.map { " ← \($0)" }.joined()
            lines.append("  task: \(task)\(parents)" + (parentTasksCut.map { " ← … (\($0))" } ?? ""))
        }
        if let threadID { lines.append("  thread \(threadID):") }
        var index = 0
        while index < frames.count {
            if index == omittedIndex { lines.append("  … \(omittedFrameCount) frames not shown") }
            let (unit, count) = repetition(at: index)
            if unit == 1 && count > 2 {
                lines.append("  #\(index)–#\(index + count - 1) \(frames[index]) × \(count)")
                index += count
            } else if unit > 1 {
                // A recursion through several functions (a closure and the function
                // it calls): the repeated group once, with its count.
                let end = index + unit * count
                lines.append("  #\(index)–#\(end - 1) × \(count), each time these \(unit) frames:")
                for position in index..<(index + unit) { lines.append("      \(frames[position])") }
                index = end
            } else {
                lines.append("  #\(index) \(frames[index])")
                index += 1
            }
        }
        if isTruncated { lines.append("  … outer frames not shown (the stack is deeper than the copy taken)") }
        if let awaitsCut { lines.append("  … awaiting callers not all shown: \(awaitsCut)") }
        return lines.joined(separator: "\n")
    }

    /// The shortest group of 1 to 4 frames that repeats from `start` (1 with a
    /// count of 1 when none does): a group of more than one frame must repeat at
    /// least 3 times. Never runs across the omitted frames.
    private func repetition(at start: Int) -> (unit: Int, count: Int) {
        let limit = omittedIndex.map { $0 > start ? $0 : frames.count } ?? frames.count
        func repeats(_ unit: Int) -> Int {
            var count = 1
            while start + (count + 1) * unit <= limit,
                (0..<unit).allSatisfy({ frames[start + count * unit + $0].sameCall(as: frames[start + $0]) })
            {
                count += 1
            }
            return count
        }
        let single = repeats(1)
        if single > 2 { return (1, single) }
        for unit in 2...4 where start + 3 * unit <= limit {
            let count = repeats(unit)
            if count >= 3 { return (unit, count) }
        }
        return (1, 1)
    }
}
