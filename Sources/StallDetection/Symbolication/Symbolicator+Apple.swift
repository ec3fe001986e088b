#if !os(Linux)
#if canImport(Darwin)
import Darwin
#endif

/// The symbolicator where the toolchain's `Runtime` module is unavailable (iOS,
/// tvOS, watchOS, visionOS, and macOS before 26): frames keep their raw address
/// with the image's name and the offset from its load address, found by `dladdr`
/// — what crash reporters upload for offline symbolication with the build's dSYMs
/// (`atos -o App.dSYM -l <load address> <address>`). No function names, files or
/// lines are guessed from the dynamic symbol table, whose nearest exported symbol
/// is often the wrong function.
///
/// Same interface as the Linux `Symbolicator` (Symbolicator.swift). Not
/// thread-safe: one symbolicator belongs to one detector's thread.
final class Symbolicator: Sendable {
    struct Key: Hashable, Sendable {
        var address: UInt
        var isReturnAddress: Bool

        var lookupAddress: UInt { isReturnAddress ? address &- 1 : address }
    }

    private let cache = Locked<[UInt: StackFrame]>([:])

    /// The process's symbolicator.
    static let shared = Symbolicator()

    init() {}

    /// No executable mappings are listed here (no `/proc`): the sampler that
    /// would need them does not exist on these platforms yet.
    var code: CodeRanges { CodeRanges(text: [], fileText: [], executableText: []) }

    var imageGeneration: Int { 0 }

    var namingCost: Int64 { 0 }

    func isFileBackedText(_ address: UInt) -> Bool { image(of: address) != nil }

    func isInExecutable(_ address: UInt) -> Bool {
        guard let found = image(of: address), let main = image(of: UInt(bitPattern: #dsohandle)) else { return false }
        return found.base == main.base
    }

    func functionStart(of address: UInt, isReturnAddress: Bool) -> UInt? { nil }

    func warmUp() {}

    /// Nothing to load ahead of time here.
    func warmUpAhead() {}

    var cachedCount: Int { cache.withLock { $0.count } }

    /// No image list is read on these platforms: a pprof export's mappings carry
    /// the image names alone.
    var loadedImages: [LoadedImage] { [] }

    func isTextAddress(_ address: UInt) -> Bool { image(of: address) != nil }

    /// No names without debug symbols: every function is unnamed.
    func functionNames(_ keys: [Key]) -> [String?] { keys.map { _ in nil } }

    /// Nothing to name ahead of time here: `dladdr` reads no debug information.
    func prefetch(_ raw: [RawFrame]) {}

    func symbolicate(_ raw: [RawFrame]) -> [StackFrame] {
        raw.map { frame in
            if let cached = cache.withLock({ $0[frame.address] }) { return cached.with(isUncertain: frame.isUncertain) }
            let made: StackFrame
            if let found = image(of: frame.address) {
                made = StackFrame(
                    address: frame.address, function: nil, file: nil, line: nil, image: found.name,
                    isUncertain: false, imageOffset: frame.address &- found.base)
            } else {
                made = StackFrame(address: frame.address, isUncertain: false)
            }
            cache.withLock { $0[frame.address] = made }
            return made.with(isUncertain: frame.isUncertain)
        }
    }

    /// The image `address` lies in: its file name (last path component) and load
    /// address.
    private func image(of address: UInt) -> (name: String, base: UInt)? {
        var info = Dl_info()
        guard let pointer = UnsafeRawPointer(bitPattern: address), dladdr(pointer, &info) != 0,
            let path = info.dli_fname
        else { return nil }
        let name = String(cString: path).split(separator: "/").last.map(String.init) ?? ""
        return (name, UInt(bitPattern: info.dli_fbase))
    }
}
#endif
