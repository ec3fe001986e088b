import CStallCapture

/// The threads running a detector's own work right now (a look, a sample, an
/// event being built), process-wide: such a thread is never the blocked thread of
/// any target, so one detector never samples another's work (with a detector per
/// queue or event loop, their looks run at the same moments; a custom target's
/// `post` may run a watched executor's job on the detector's own thread).
///
/// A sample is taken between two readings (``quietMark(_:)`` and
/// ``stayedQuiet(_:since:)``): a thread that began a detector's work in between
/// is caught by the second even when it has finished that work again.
///
/// On Apple platforms every thread id is 0, so every thread counts as a
/// detector's; nothing asks there, as no thread is sampled (``SamplingSupport``).
enum DetectorThreads {
    private struct Registry {
        /// Threads inside ``work(_:)``, with their nesting depth.
        var running: [Int32: Int] = [:]
        /// Each thread's last entry into ``work(_:)``, numbered by `entries`.
        var lastEntry: [Int32: UInt64] = [:]
        /// Entries into ``work(_:)`` so far, process-wide.
        var entries: UInt64 = 0

        /// Forgets entries too old to matter to any sample under way (the map
        /// would otherwise keep every thread that ever did a detector's work).
        mutating func prune() {
            guard lastEntry.count > DetectorThreads.rememberedThreads, entries > DetectorThreads.rememberedEntries
            else {
                return
            }
            let oldest = entries &- DetectorThreads.rememberedEntries
            lastEntry = lastEntry.filter { running[$0.key] != nil || $0.value > oldest }
        }
    }

    private static let registry = Locked(Registry())
    /// Threads remembered before old entries are forgotten.
    private static let rememberedThreads = 4_096
    /// Entries a sample may span (64 detectors sampling at 100/s give 6,400 a
    /// second) and still see a thread's entry.
    private static let rememberedEntries: UInt64 = 1 << 20

    /// Runs `body` with the calling thread counted as a detector's.
    static func work<Result>(_ body: () throws -> Result) rethrows -> Result {
        let thread = stallcapture_current_tid()
        registry.withLock { registry in
            registry.entries &+= 1
            registry.running[thread, default: 0] += 1
            registry.lastEntry[thread] = registry.entries
            registry.prune()
        }
        defer {
            registry.withLock { registry in
                let left = (registry.running[thread] ?? 1) - 1
                registry.running[thread] = left == 0 ? nil : left
            }
        }
        return try body()
    }

    /// Whether `thread` runs a detector's work now.
    static func contains(_ thread: Int32) -> Bool {
        registry.withLock { $0.running[thread] != nil }
    }

    /// A mark to sample `thread` against, or nil when it runs a detector's work
    /// now.
    static func quietMark(_ thread: Int32) -> UInt64? {
        registry.withLock { $0.running[thread] == nil ? $0.entries : nil }
    }

    /// Whether `thread` did no detector's work at any moment since `mark` was
    /// taken (``quietMark(_:)``).
    static func stayedQuiet(_ thread: Int32, since mark: UInt64) -> Bool {
        registry.withLock { $0.running[thread] == nil && ($0.lastEntry[thread] ?? 0) <= mark }
    }
}
