import CStallCapture

/// The threads running a detector's own work right now (a look, a sample, an
/// event being built), process-wide: such a thread is never the blocked thread of
/// any target, so one detector never samples another's work (with a detector per
/// queue or event loop, their looks run at the same moments, on dispatch workers
/// that may have run a watched queue's job before).
enum DetectorThreads {
    private static let running = Locked<[Int32: Int]>([:])

    /// Runs `body` with the calling thread counted as a detector's.
    static func work<Result>(_ body: () throws -> Result) rethrows -> Result {
        let thread = stallcapture_current_tid()
        running.withLock { $0[thread, default: 0] += 1 }
        defer {
            running.withLock { running in
                let left = (running[thread] ?? 1) - 1
                running[thread] = left == 0 ? nil : left
            }
        }
        return try body()
    }

    /// Whether `thread` runs a detector's work now.
    static func contains(_ thread: Int32) -> Bool {
        running.withLock { $0[thread] != nil }
    }
}
