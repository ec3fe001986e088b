import CStallCapture
import Dispatch

/// What sampling one thread gave.
enum ThreadSample {
    case stack(RawStack)
    /// No stack: why (``StallBacktrace/unavailableReason``), or a running thread
    /// that gave none (``StallBacktrace/whileRunning``).
    case failed(StallBacktrace)
    /// The thread ran a detector's work at some moment of the sample
    /// (``DetectorThreads``), or a detector's probe on its target
    /// (`answeringProbe`: the stall it answers was over): its stack is no
    /// target's stall.
    case detectorWork(answeringProbe: Bool)
}
