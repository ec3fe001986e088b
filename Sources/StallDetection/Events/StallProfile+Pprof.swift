#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension StallProfile {
    /// The profile in pprof's format: a gzipped `perftools.profiles.Profile`
    /// protocol buffer, what Grafana Pyroscope, Parca, Google Cloud Profiler,
    /// `go tool pprof` and speedscope read.
    ///
    /// ```swift
    /// for await event in detector.events where event.phase == .ended {
    ///     let bytes = event.profile.pprof(labels: [("service", "api")])
    ///     FileManager.default.createFile(atPath: "stall.pb.gz", contents: Data(bytes))
    /// }
    /// // go tool pprof -top stall.pb.gz
    /// ```
    ///
    /// ``StallEvent/pprof(endedAt:)`` adds the event's labels (stall id, target,
    /// activities) for you.
    ///
    /// What the file holds:
    /// - two sample types, `samples`/`count` and `wall`/`nanoseconds` (the
    ///   default); each sample stands for the measured spacing of the samples,
    ///   ``span`` / (``sampleCount`` − 1), or ``interval`` for a single sample:
    ///   the `period`, with `period_type` `wall`/`nanoseconds`. The wall time of
    ///   the whole profile (`duration_nanos`) is ``sampleCount`` × period.
    /// - one pprof sample per entry of ``stacks``, with its count, so that
    ///   `go tool pprof -top -sample_index=samples` shows each function of
    ///   ``functions`` with its ``Function/samples`` as the cumulative count.
    /// - a function per entry of ``functions`` (name, file; `start_line` is 0, as
    ///   the profile knows the lines its samples were at, not where a function
    ///   begins), and a location per function, its line the one seen in most of
    ///   the function's samples. The profile keeps no addresses and does not say
    ///   which of its functions were inlined, so each location has address 0 and
    ///   one line.
    /// - a mapping per image named by a function: on Linux the path, build id
    ///   and load range of that image as loaded in *this* process (a profile read
    ///   back from a fatal report is matched to this process's images by name);
    ///   elsewhere the image name alone.
    /// - `labels` on every sample, as string labels, in order (a key may repeat).
    ///
    /// - Parameters:
    ///   - labels: key–value pairs put on every sample: what a profiling backend
    ///     filters and groups by.
    ///   - endedAt: when the profile's last sample was taken; `time_nanos` is this
    ///     minus the profile's duration. Defaults to now, right for an `.ended`
    ///     event exported as it arrives.
    /// - Returns: the gzip file's bytes.
    ///
    /// Thread-safe. The data is compressed with DEFLATE's fixed Huffman codes: a
    /// stall's file is about 60 % of the protocol buffer's size, some 10 % larger
    /// than `gzip -6` would make it.
    ///
    /// - Complexity: O(n) in the size of the profile, plus the compression.
    public func pprof(labels: [(key: String, value: String)] = [], endedAt: Date = Date()) -> [UInt8] {
        Gzip.compress(pprofMessage(labels: labels, endedAt: endedAt, images: Self.processImages()))
    }

    /// The uncompressed `Profile` message.
    func pprofMessage(labels: [(key: String, value: String)], endedAt: Date, images: [LoadedImage]) -> [UInt8] {
        let duration = sampleWallNanoseconds * Double(sampleCount)
        let start = endedAt.timeIntervalSince1970 * 1e9 - duration
        let encoder = PprofEncoder(
            profile: self, labels: labels,
            images: Dictionary(images.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first }),
            timeNanoseconds: Int64(exactly: start.rounded()) ?? 0)
        return encoder.encode()
    }

    /// The images of this process, for the mappings.
    static func processImages() -> [LoadedImage] {
        Symbolicator.shared.loadedImages
    }

    /// The wall time one sample stands for, in nanoseconds: the measured spacing
    /// of the samples (their span shared evenly), or the sampling interval when
    /// there is one sample; 0 with none.
    var sampleWallNanoseconds: Double {
        if sampleCount > 1, span > .zero { return Double(Monotonic.nanoseconds(span)) / Double(sampleCount - 1) }
        return sampleCount > 0 ? Double(Monotonic.nanoseconds(interval)) : 0
    }
}
