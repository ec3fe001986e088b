import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One thread's stack as the sampler saw it: registers and a copy of the stack.
struct StackCopy {
    var pc: UInt
    var sp: UInt
    /// The frame pointer, when known (a signal sample); nil for a thread read from
    /// `/proc` while it sleeps in the kernel.
    var fp: UInt?
    /// The stack words from `sp` upward, as far as they were copied.
    var words: [UInt]
    /// Whether the copy ends before the stack does.
    var truncated: Bool
    /// The dispatch queue whose job the thread ran when it was signalled; nil for
    /// a thread read from `/proc` (its stack words are searched instead).
    var queue: UInt? = nil
    /// When the copied stack was the thread's (monotonic nanoseconds): the
    /// signal handler's moment, or the `/proc` read's.
    var time: Int64? = nil
    /// How long the thread took to answer the signal (nanoseconds): it ran
    /// nothing meanwhile. Zero for a `/proc` read.
    var answerDelay: Int64 = 0
    /// The thread's scheduling counts (`schedstat`) while it was read from
    /// `/proc`: unchanged later, it has not run since. Nil for a signal sample,
    /// and where the kernel keeps none.
    var scheduling: String? = nil
    /// The Swift task the thread ran (0: none) while its stack was the one
    /// copied: read by the handler, or for a thread asleep between the two
    /// readings that prove it did not run; nil when unknown (the runtime's
    /// slot is not located, see ``SwiftTaskLayout``, or a sleeping thread's
    /// pointer is not known).
    var task: UInt? = nil
    /// The thread's pointer, through which its task slot is read again.
    var threadPointer: UInt? = nil
    /// The last sample's async contexts (``AsyncContextChain/contexts``) and
    /// the two words at each (``StackSampler/readPairs(at:between:)``), read
    /// with a `/proc` copy while the thread held still: its chain, confirmed
    /// against them, is the copy's. Nil for a signal sample.
    var contextPairs: (contexts: [UInt], pairs: [UInt])? = nil
}
