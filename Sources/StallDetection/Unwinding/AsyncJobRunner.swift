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
/// statically (`--static-swift-stdlib`). Empty where that table cannot be read
/// (Apple platforms read no ELF; there the async chain is not followed).
enum AsyncJobRunner {
    /// The job runners' code, sorted by start.
    static let ranges: [Range<UInt>] = {
        #if os(Linux)
        guard let exported = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "swift_job_run") else { return [] }
        var path = [CChar](repeating: 0, count: 4096)
        var base: UInt = 0
        guard stallcapture_image_of(UInt(bitPattern: exported), &path, path.count, &base) == 1 else { return [] }
        let name = String(decoding: path.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let functions = ElfReader.withFile(name) { reader -> [ElfSymbolTable.Function]? in
            guard let firstLoad = reader.firstLoadAddress() else { return nil }
            return reader.functions(section: ElfReader.symbolTableSection, bias: base &- firstLoad, names: true)
        }
        return (functions ?? [])
            .filter { isJobRunner($0.name ?? "") && $0.size > 0 }
            .map { $0.start..<($0.start &+ $0.size) }
            .sorted { $0.lowerBound < $1.lowerBound }
        #else
        return []
        #endif
    }()

    /// Whether a symbol names one of the runtime's job runners.
    static func isJobRunner(_ symbol: String) -> Bool {
        symbol.hasPrefix("swift_job_run") || symbol.hasPrefix("_swift_job_run")
            || symbol.contains("runJobInEstablishedExecutorContext")
    }

    /// Whether `returnAddress` returns into a job runner.
    static func contains(returnAddress: UInt) -> Bool {
        let address = returnAddress &- 1
        return ranges.contains { $0.contains(address) }
    }
}
