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
enum SamplingTrace {
    static let isEnabled = getenv("STALLDETECTION_TRACE").map { String(cString: $0) == "1" } ?? false

    static func sample(cost: Int64, naming: Int64, kept: Bool, next: Int64?, taken: Int64) {
        let line =
            "stalldetection sample \(cost / 1_000) \(naming / 1_000) \(kept ? 1 : 0) \((next ?? -1_000) / 1_000) "
            + "\(taken / 1_000)\n"
        _ = line.withCString { write(2, $0, strlen($0)) }
    }
}
