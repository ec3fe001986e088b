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
/// thread-safe: one symbolicator belongs to one detector queue.
final class Symbolicator {
    struct Key: Hashable {
        var address: UInt
        var isReturnAddress: Bool
    }

    private var cache: [UInt: StackFrame] = [:]

    init() {}

    func isFileBackedText(_ address: UInt) -> Bool { image(of: address) != nil }

    func isInExecutable(_ address: UInt) -> Bool {
        guard let found = image(of: address), let main = image(of: UInt(bitPattern: #dsohandle)) else { return false }
        return found.base == main.base
    }

    func functionStart(of address: UInt, isReturnAddress: Bool) -> UInt? { nil }

    func warmUp() {}

    var cachedCount: Int { cache.count }

    func isTextAddress(_ address: UInt) -> Bool { image(of: address) != nil }

    func symbolicate(_ raw: [RawFrame]) -> [StackFrame] {
        raw.map { frame in
            let named =
                cache[frame.address]
                ?? {
                    let made: StackFrame
                    if let found = image(of: frame.address) {
                        made = StackFrame(
                            address: frame.address, function: nil, file: nil, line: nil, image: found.name,
                            isUncertain: false, imageOffset: frame.address &- found.base)
                    } else {
                        made = StackFrame(address: frame.address, isUncertain: false)
                    }
                    cache[frame.address] = made
                    return made
                }()
            return named.with(isUncertain: frame.isUncertain)
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
