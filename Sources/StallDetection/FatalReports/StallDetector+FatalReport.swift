extension StallDetector {
    /// The report of a stall that was still going on when the process ended (it
    /// was killed, crashed or exited mid-stall), written by a detector created with
    /// `fatalReportPath: path`; nil when there is none. Reading removes the file.
    ///
    /// ```swift
    /// let path = cachesDirectory + "/stall-report.json"
    /// if let previous = StallDetector.takeFatalStallReport(at: path) {
    ///     upload(String(describing: previous))   // the stack, the profile so far, the activities
    /// }
    /// let detector = StallDetector(target: .mainQueue, threshold: .milliseconds(250), fatalReportPath: path)
    /// detector.start()
    /// ```
    ///
    /// The event has phase `.started`, ``StallEvent/endedWithProcess`` set, the
    /// stack sampled when the stall was detected, and the duration, profile and
    /// activities as last written (the file is refreshed a few times a second while
    /// a stall lasts). A file that is not such a report (corrupt, truncated, empty,
    /// written by something else, larger than 16 MB, a FIFO, a symbolic link)
    /// gives nil and is removed too (a directory is left alone); it never traps
    /// and never blocks. Call it before starting a detector with the same path.
    ///
    /// Taking is atomic: of threads or processes taking the same report at once,
    /// exactly one gets it and the others get nil. In a directory this process
    /// cannot write to, the report is read where it is and stays.
    ///
    /// The report is safe in a directory other users can write to: it is written
    /// to a temporary file with a name nobody can predict, created exclusively
    /// (never through a link, never opening a FIFO), readable by its owner only
    /// (mode 0600), and renamed into place. A report never exceeds 16 MB: the
    /// longest activity labels are cut first, then the call tree, then the profile's least-sampled
    /// functions, and ``StallEvent/truncationNote`` says what was cut.
    ///
    /// Temporary files a process killed in the middle of writing the report left
    /// beside it (this user's, named after the report) are removed too.
    ///
    /// One path per detector: two detectors given the same path overwrite each
    /// other's report, and the first stall to end removes it.
    ///
    /// - Parameter path: The path given as `fatalReportPath`.
    /// - Returns: The stall the previous run died in, or nil.
    public static func takeFatalStallReport(at path: String) -> StallEvent? {
        // Claimed first (renamed to a name of this caller's): of callers taking
        // the report at once, exactly one gets it. Only a regular file is read,
        // without blocking on a FIFO or following a link; anything else gives nil
        // and is removed too, except a directory, which is left alone.
        guard let files = FatalReportFiles(path: path) else { return nil }
        defer { files.close() }
        files.removeLeftovers()
        guard let claimed = files.claim(),
            let bytes = files.readRegularFile(claimed, limit: FatalReportFile.maximumBytes)
        else { return nil }
        return FatalReportFile.decode(bytes)?.event
    }
}
