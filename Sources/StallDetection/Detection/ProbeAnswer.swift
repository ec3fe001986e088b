import CStallCapture

/// Where a probe ran: the thread, and the serial dispatch queue whose job it was
/// (nil outside one), so that the blocked thread can later be told from a worker
/// that has moved on to another queue's job. The thread is the kernel's id: 0 on
/// Apple platforms, where no thread is looked for (``SamplingSupport``).
struct ProbeAnswer: Sendable {
    var thread: Int32
    var queue: UInt?

    /// The calling thread and the serial queue it drains now; the thread's
    /// pointer is remembered (``ThreadPointers``).
    static func here() -> ProbeAnswer {
        ThreadPointers.recordCurrent()
        let queue = stallcapture_current_serial_queue()
        return ProbeAnswer(thread: stallcapture_current_tid(), queue: queue == 0 ? nil : queue)
    }
}
