#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension StallEvent {
    /// The event's ``profile`` in pprof's format (gzipped protocol buffer), every
    /// sample labelled with the stall: `stall_id` (``id``), `target`
    /// (``target``), one `activity` per entry of ``activities`` (outermost
    /// first), and `task_name` when the report knows which Swift task was
    /// running.
    ///
    /// ```swift
    /// for await event in detector.events where event.phase == .ended {
    ///     let path = "/var/tmp/stall-\(event.id).pb.gz"
    ///     FileManager.default.createFile(atPath: path, contents: Data(event.pprof()))
    /// }
    /// // go tool pprof -http=: /var/tmp/stall-3.pb.gz
    /// ```
    ///
    /// See ``StallProfile/pprof(labels:endedAt:)`` for what the file holds.
    ///
    /// - Parameter endedAt: when the profile's last sample was taken; defaults to
    ///   now, right for an `.ended` event exported as it arrives.
    /// - Returns: the gzip file's bytes.
    public func pprof(endedAt: Date = Date()) -> [UInt8] {
        profile.pprof(labels: pprofLabels, endedAt: endedAt)
    }

    /// The labels ``pprof(endedAt:)`` puts on every sample.
    var pprofLabels: [(key: String, value: String)] {
        var labels: [(key: String, value: String)] = [("stall_id", String(id)), ("target", target)]
        labels += activities.map { ("activity", $0) }
        if let taskName { labels.append(("task_name", taskName)) }
        return labels
    }
}
