#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A diagnostic for measuring what profiling a stall costs: with the environment
/// variable `STALLDETECTION_TRACE=1`, every profile sample prints one line to
/// standard error,
///
///     stalldetection sample <cost µs> <naming µs> <kept 0|1> <next in µs> <taken at µs>
///
/// its CPU cost on the sampling thread (capture and unwinding, and the part
/// of it done once: naming functions by their symbols for the first time, the
/// sampler's first sample), whether it
/// joined the profile, when the next sample is due, and when this one was taken
/// (monotonic clock), from which gaps between samples are read. The stall probe's
/// `first-stall` scenario and `Benchmarks/stall-rates.sh` read these lines.
/// A look that took a stack also prints its raw frames (innermost first, an
/// uncertain one marked `?`), to trace a frame an unwind lost or made up:
///
///     stalldetection frames <address hex>[?] …
///
/// With `STALLDETECTION_TRACE=2`, every unwind also prints the copy it unwound
/// (its first 1,024 words), so that such a look can be unwound again by hand or
/// in a test:
///
///     stalldetection copy <thread> <pc> <sp> <fp|-> <truncated 0|1> <word hex> …
///
/// Every search for a target's blocked thread prints what it saw, to trace a
/// report that blames the wrong thread:
///
///     stalldetection find <target> queue=<address> last=<tid> drainer=<tid|none|unknown> <tid>:<verdict> … -> <tid|none>
///
/// each thread it sampled with its verdict (`detector`, `failed`, or the queue
/// its thread-specific data names, whether its stack's words hold the watched
/// queue, whether it runs a job, and `took` or `skip`).
///
/// The probes' timeline, to trace a stall seen late or measured short (a
/// detector whose own threads waited for a core):
///
///     stalldetection probe <beat|posted|answered|look> <when µs> <late µs>
///
/// each beat (with how late it ran after its grid point), each probe handed to
/// a posted target (`.custom`, the cooperative pool), each answer, and each look
/// (with how late it ran after it was due), on the monotonic clock.
///
/// A stall no look saw before it ended (a missed stall) prints what was decided,
/// to trace a stall that went unreported:
///
///     stalldetection missed <duration µs> <reported|stopped|debugged|no-evidence>
enum SamplingTrace {
    static let isEnabled = level >= 1
    /// Whether each unwind's copy is printed too (`copy`).
    static let printsCopies = level >= 2
    private static let level = getenv("STALLDETECTION_TRACE").flatMap { Int(String(cString: $0)) } ?? 0

    static func sample(cost: Int64, naming: Int64, kept: Bool, next: Int64?, taken: Int64) {
        let line =
            "stalldetection sample \(cost / 1_000) \(naming / 1_000) \(kept ? 1 : 0) \((next ?? -1_000) / 1_000) "
            + "\(taken / 1_000)\n"
        _ = line.withCString { write(2, $0, strlen($0)) }
    }

    /// Prints a look's raw frames (`frames`).
    static func frames(_ frames: [RawFrame]) {
        let words = frames.map { String($0.address, radix: 16) + ($0.isUncertain ? "?" : "") }
        let text = "stalldetection frames " + words.joined(separator: " ") + "\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }

    /// Prints the copy an unwind reads (`copy`).
    static func copy(_ copy: StackCopy, thread: Int32) {
        let head = [copy.pc, copy.sp].map { String($0, radix: 16) } + [copy.fp.map { String($0, radix: 16) } ?? "-"]
        let words = copy.words.prefix(1_024).map { String($0, radix: 16) }
        let text =
            "stalldetection copy \(thread) " + (head + [copy.truncated ? "1" : "0"] + words).joined(separator: " ")
            + "\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }

    /// Prints one point of the probes' timeline (`probe`).
    static func probe(_ what: StaticString, at time: Int64, late: Int64 = 0) {
        let text = "stalldetection probe \(what) \(time / 1_000) \(late / 1_000)\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }

    /// Prints what became of a missed stall (`missed`).
    static func missed(duration: Int64, _ verdict: String) {
        let text = "stalldetection missed \(duration / 1_000) \(verdict)\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }

    /// Prints one search's line (`find`), when the trace is on.
    static func find(_ line: String) {
        let text = "stalldetection find \(line)\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }

    /// A sampled thread's verdict in a search's line.
    static func verdict(_ thread: Int32, _ raw: RawStack, runsJob: Bool, took: Bool) -> String {
        let current = raw.currentQueue.map { String($0, radix: 16) } ?? "nil"
        let words = raw.wordsHoldQueue.map { $0 ? "1" : "0" } ?? "nil"
        return "\(thread):q=\(current),w=\(words),job=\(runsJob ? 1 : 0),\(took ? "took" : "skip")"
    }
}
