import CStallCapture
import Dispatch

/// A thread's stack as sampled and unwound, before any frame is named in full.
struct RawStack: Sendable {
    var thread: Int32
    /// Innermost first: the interrupted instruction, then return addresses.
    var frames: [RawFrame]
    /// The copy of the stack ended before the stack did, or the stack a signal
    /// frame leads to could not be read.
    var copyTruncated: Bool
    /// The watched queue's address, if one is watched.
    var queue: UInt?
    /// The queue whose job the thread ran (exact): when signalled, read by the
    /// handler; for a thread read from `/proc` (asleep), read from libdispatch's
    /// record after the copy when the thread once answered a probe
    /// (``ThreadPointers``); nil when unknown.
    var currentQueue: UInt?
    /// Whether the watched queue's address is among the stack's words (the
    /// queue's drain keeps it while its job runs); nil when the unwind went
    /// beyond the words copied (through a signal frame to the thread's own
    /// stack, or past the copy's end), so the copy cannot tell.
    var wordsHoldQueue: Bool?
    /// Why the awaits above the running async function stop before the task's
    /// entry (``AsyncContextChain/Cut``); nil when they reach it, or the thread
    /// runs no async function.
    var awaitsCut: AsyncContextChain.Cut?
    /// Where the awaits stop among `frames` when they are cut: the index of
    /// the job runner's frame above the awaiting callers shown.
    var awaitsCutIndex: Int?
    /// The Swift task the thread ran and its parents, read right after the
    /// copy (the task's address: by the handler when signalled, else from the
    /// runtime's slot for a thread that once answered a probe, see
    /// ``ThreadPointers``); nil when it ran none or that is unknown.
    var task: TaskChain?
    /// When the stack was the thread's (``StackCopy/time``), if known.
    var time: Int64?
    /// How long the thread took to answer the signal (``StackCopy/answerDelay``).
    var answerDelay: Int64 = 0
    /// Whether the thread was signalled (it was runnable: on a core or waiting
    /// for one), rather than read from `/proc` asleep.
    var signalled = false

    /// When the stack was the thread's, and how long the thread took to answer.
    struct Timing: Sendable {
        var seen: Int64
        var answerDelay: Int64
    }

    /// The frames a profile records: `frames`, with a marker where the
    /// awaiting callers stop before the task's entry (``RawFrame/isAwaitsCut``),
    /// so that a sample without them says why rather than passing for a task
    /// entered there. (A report says it in ``StallBacktrace/awaitsCut``.)
    var profileFrames: [RawFrame] {
        guard let awaitsCut, let index = awaitsCutIndex, index > 0, index <= frames.count else { return frames }
        var marked = frames
        marked.insert(.awaitsCut(awaitsCut), at: index)
        return marked
    }

    /// The stack's ``Timing``, when its time is known.
    var timing: Timing? { time.map { Timing(seen: $0, answerDelay: answerDelay) } }
}
