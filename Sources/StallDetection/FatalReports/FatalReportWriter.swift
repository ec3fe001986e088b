#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Keeps one detector's fatal report file: written at `.started`, rewritten while
/// the stall lasts, removed at `.ended` and by `stop()`.
///
/// Writes happen on a thread of their own (a ``DetectorWorker``: an `fsync` can
/// take a while, and the detector's thread keeps sampling meanwhile) and coalesce: a write asked for
/// while another is pending replaces it. Each write goes to a new temporary file
/// beside the report, with a name nobody can predict (`FatalReportFiles`,
/// relative to the report's directory), created exclusively, never through a
/// link and never blocking; it is flushed
/// to disk (`fsync`), then renamed over the report, and the directory is
/// flushed: the report on disk is always a whole one, and only its writer can
/// read it (mode 0600).
///
/// A removal happens on the caller's thread and never waits for a write in
/// progress: a write begun before it is not renamed into place any more (the
/// check and the rename happen under one lock, and so does the removal's
/// `unlink`: the only file operations done under it).
final class FatalReportWriter: Sendable {
    let path: String
    private let writer = DetectorWorker(name: "StallReportFile")
    /// The event waiting to be written, whether a write block is queued, and the
    /// number of removals so far: a write renames its file into place only while
    /// no removal came after the event it took.
    /// `closed`: the detector stopped; nothing is written any more.
    private let state = Locked<(event: StallEvent?, scheduled: Bool, removals: UInt64, closed: Bool)>(
        (nil, false, 0, false))

    init(path: String) {
        self.path = path
    }

    func write(_ event: StallEvent) {
        let schedule = state.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.event = event
            let schedule = !state.scheduled
            state.scheduled = true
            return schedule
        }
        guard schedule else { return }
        writer.async { [self] in DetectorThreads.work { writePending() } }
    }

    /// Writes the report asked for last, if it is still wanted.
    private func writePending() {
        let taken = state.withLock { state -> (event: StallEvent?, removals: UInt64) in
            state.scheduled = false
            return (state.event.take(), state.removals)
        }
        guard let event = taken.event else { return }
        let bytes = FatalReportFile(event).encodedWithinLimit()
        guard !bytes.isEmpty else { return }
        writeAtomically(bytes, unlessRemovedSince: taken.removals)
    }

    /// Removes the report now; a write in progress is dropped (its temporary
    /// file removed), a pending one too.
    func remove() {
        state.withLock { state in
            state.event = nil
            state.removals &+= 1
            // Under the lock, as a write's rename is: a write that begins after
            // this removal cannot have its report unlinked by it.
            unlink(path)
        }
    }

    /// Removes the report for good (the detector stopped): a write asked for
    /// later, by a sample that was under way, writes nothing.
    func stopWriting() {
        state.withLock { $0.closed = true }
        remove()
        writer.finish()
    }

    /// Waits until every write asked for so far is done (tests).
    func flush() { writer.sync {} }

    /// Temporary file, `fsync`, `rename` unless a removal came after the event
    /// was taken (`removals` then), `fsync` of the directory.
    private func writeAtomically(_ bytes: [UInt8], unlessRemovedSince removals: UInt64) {
        guard let files = FatalReportFiles(path: path) else { return }
        defer { files.close() }
        guard let (descriptor, temporary) = files.createTemporary() else { return }
        let written = FatalReportFiles.writeAll(bytes, to: descriptor)
        let synced = fsync(descriptor) == 0
        FatalReportFiles.closeFile(descriptor)
        let renamed =
            written && synced
            && state.withLock { state in
                // Checked under the lock that remove() takes before it unlinks:
                // no report appears after a removal returned.
                state.removals == removals && files.rename(temporary, to: files.name)
            }
        guard renamed else {
            files.unlink(temporary)
            return
        }
        files.sync()
    }
}
