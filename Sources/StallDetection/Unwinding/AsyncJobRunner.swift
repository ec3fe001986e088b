import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where Swift's concurrency runtime calls a job's partial function: a frame
/// whose return address lies here is a running async function, with its async
/// context below its frame record (``AsyncContextChain``).
///
/// The runtime's job runners are `swift_job_run` and its variants for task
/// executors (exported), and `swift::runJobInEstablishedExecutorContext` (a
/// local symbol of the concurrency library) that they call. Found once per
/// process in the symbol table of the image that exports `swift_job_run`: the
/// concurrency library, or the executable itself when the runtime is linked
/// statically (`--static-swift-stdlib`), by the bytes of their names. Empty
/// where that table cannot be read (Apple platforms read no ELF; there the
/// async chain is not followed), and until a detector's warm-up has read it
/// (on the detector's thread, before its first look).
enum AsyncJobRunner {
    /// The job runners' code, sorted by start, once ``find()`` has run.
    private static let found = Locked<[Range<UInt>]?>(nil)

    /// The job runners' code, sorted by start (empty until ``find()`` ran: a
    /// sample never waits for the symbol table to be read).
    static var ranges: [Range<UInt>] { found.withLock { $0 } ?? [] }

    /// Reads the job runners' code from the symbol table, once per process
    /// (a detector's warm-up; 0.7 ms in a release build).
    static func find() {
        guard found.withLock({ $0 == nil }) else { return }
        let ranges = read()
        found.withLock { if $0 == nil { $0 = ranges } }
    }

    /// The names of the runtime's job runners: `swift_job_run` and its
    /// variants, and `swift::runJobInEstablishedExecutorContext(swift::Job*)`.
    static let namePrefixes: [[UInt8]] = [
        "swift_job_run", "_swift_job_run", "_ZN5swift34runJobInEstablishedExecutorContext",
    ].map { Array($0.utf8) }

    private static func read() -> [Range<UInt>] {
        #if os(Linux)
        let functions = RuntimeImage.functions(exporting: "swift_job_run", namedLike: namePrefixes) ?? []
        return
            functions
            .filter { $0.size > 0 }
            .map { $0.start..<($0.start &+ $0.size) }
            .sorted { $0.lowerBound < $1.lowerBound }
        #else
        return []
        #endif
    }

    /// Whether `returnAddress` returns into a job runner (of `runners`, by
    /// default those found so far: an unwind reads ``ranges`` once and passes it).
    static func contains(returnAddress: UInt, in runners: [Range<UInt>] = ranges) -> Bool {
        let address = returnAddress &- 1
        return runners.contains { $0.contains(address) }
    }
}
