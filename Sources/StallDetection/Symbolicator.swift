#if os(Linux)
// The toolchain's `Runtime` module: built for Linux and macOS only, and on macOS
// available from macOS 26 (above this package's floor). Apple platforms use the
// `dladdr` symbolicator in ImageSymbolicator.swift instead.
import Runtime
#endif

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Turns raw addresses into named frames with the toolchain's `Runtime` module, and
/// remembers every address it named.
///
/// `Runtime.Backtrace` has no public initializer from addresses, but its `Codable`
/// form carries the addresses in the Compact Backtrace Format (a header byte, then
/// one instruction per frame); this builds that form and decodes it. The
/// `ImageMap` (the loaded images) is captured once and again only when an address
/// lies in a file's executable mapping that no known image covers, that is after a
/// `dlopen`; names already found stay cached.
///
/// Inlined frames: `symbolicated()` lists the frames inlined at an address
/// *before* the frame they were inlined into (innermost first, as a stack is read),
/// and every one of them carries the captured address it came from; each is given
/// that address and that frame's "uncertain" flag.
///
/// The cache: an address (with its kind: the interrupted instruction or a return
/// address) always names the same frames while its image stays loaded, so each is
/// symbolicated once; a repeated stall costs dictionary look-ups. The cache is
/// dropped when the image map is refreshed.
///
/// Not thread-safe: one symbolicator belongs to one detector queue.
#if os(Linux)
final class Symbolicator {
    private var images: ImageMap
    private var encodedImages: String
    /// The executable mappings of the process (`r-x` in `/proc/self/maps`), sorted
    /// by start: the only memory the call decoder reads directly.
    private var textRanges: [(start: UInt, end: UInt)] = []

    struct Key: Hashable {
        var address: UInt
        var isReturnAddress: Bool
    }

    /// Frames (innermost first, inlined ones included) per address.
    private var cache: [Key: [StackFrame]] = [:]
    /// The start of the function (not inlined) each cached address lies in, when the
    /// image's symbols tell.
    private var starts: [Key: UInt] = [:]
    /// Executable mappings of files (not the vDSO or anonymous code).
    private var fileTextRanges: [(start: UInt, end: UInt)] = []
    /// The main executable's text, whose symbol table is complete.
    private var executableText: [(start: UInt, end: UInt)] = []

    /// One use of `Runtime` at a time in the process (another detector's stall
    /// waits for it), and the process's image map, shared by every symbolicator
    /// (each detector has one) and taken before the first symbolication. A map
    /// taken *after* one (a second detector's) also lists the debug-information
    /// files `Runtime` has mapped meanwhile (`/usr/lib/debug/.build-id/…`, with the
    /// same build id as their library), and with it `Runtime` named nothing at
    /// all: 0 of 6 libc frames (`ImageOffsetTests`). Replaced only when a library
    /// is loaded later.
    private static let runtimeAccess = Locked<ImageMap?>(nil)

    private static func processImages(refreshing: Bool) -> ImageMap {
        runtimeAccess.withLock { shared in
            if !refreshing, let shared { return shared }
            let captured = ImageMap.capture()
            shared = captured
            return captured
        }
    }

    init() {
        images = Self.processImages(refreshing: false)
        encodedImages = Self.encode(images)
        textRanges = Self.textRanges(images)
        fileTextRanges = Self.textRanges(images, of: "/")
        executableText = Self.textRanges(images, of: Self.executablePath)
    }

    /// Whether `address` lies in an executable mapping of a file.
    func isFileBackedText(_ address: UInt) -> Bool {
        fileTextRanges.contains { address >= $0.start && address < $0.end }
    }

    private static let executablePath: String = {
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard count > 0 else { return "" }
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }()

    /// Whether `address` lies in the main executable's text.
    func isInExecutable(_ address: UInt) -> Bool {
        executableText.contains { address >= $0.start && address < $0.end }
    }

    /// The start of the function `address` lies in (the interrupted instruction, or
    /// a return address), from the image's symbols; nil when unknown.
    ///
    /// An address not cached yet is named in full (and cached for the frames that
    /// come later), so its cost counts as naming: the unwinder asks for every
    /// candidate return address in the executable while it proves a sleeping
    /// thread's frames, and the first such unwind in a process took 47 ms here
    /// (which, charged to the profiler's pace, stopped sampling for 4.5 s).
    func functionStart(of address: UInt, isReturnAddress: Bool) -> UInt? {
        let key = Key(address: address, isReturnAddress: isReturnAddress)
        if cache[key] == nil {
            let before = StallProfiler.threadCPU()
            resolve([key])
            namingCost += StallProfiler.threadCPU() - before
        }
        return starts[key]
    }

    /// Symbolicates the current stack once, so that the first real stall does not
    /// pay for loading symbol tables and debug information.
    func warmUp() {
        Self.runtimeAccess.withLock { _ in
            if let here = try? Backtrace.capture(limit: 16) {
                _ = here.symbolicated(with: images)
            }
        }
    }

    /// CPU nanoseconds spent naming addresses not cached yet (the profiler's pace
    /// tells it from the cost of sampling).
    private(set) var namingCost: Int64 = 0

    /// The number of cached addresses.
    var cachedCount: Int { cache.count }

    /// Whether `address` lies in an executable mapping, with the 7 bytes before it
    /// (where the call instruction would be) in the same mapping.
    func isTextAddress(_ address: UInt) -> Bool {
        var low = 0
        var high = textRanges.count
        while low < high {
            let middle = (low + high) / 2
            if textRanges[middle].start <= address { low = middle + 1 } else { high = middle }
        }
        guard low > 0 else { return false }
        let range = textRanges[low - 1]
        return address >= range.start + 8 && address < range.end
    }

    /// Names the frames; unknown ones keep only their address. The first frame is
    /// the interrupted instruction, the others return addresses.
    func symbolicate(_ raw: [RawFrame]) -> [StackFrame] {
        guard !raw.isEmpty else { return [] }
        let keys = raw.enumerated().map { Key(address: $0.element.address, isReturnAddress: $0.offset > 0) }
        var missing: [Key] = []
        var seen = Set<Key>()
        for key in keys where cache[key] == nil && seen.insert(key).inserted { missing.append(key) }
        if !missing.isEmpty {
            let before = StallProfiler.threadCPU()
            // A new image (a `dlopen` since the map was taken): executable text of a
            // file the map does not know. (The vDSO is in no image map: taking the
            // map again for it lost every library's symbols.)
            if missing.contains(where: {
                isFileBackedText($0.address) && images.indexOfImage(at: Backtrace.Address(UInt64($0.address))) == nil
            }) {
                refreshImages()
            }
            resolve(missing)
            namingCost += StallProfiler.threadCPU() - before
        }
        var frames: [StackFrame] = []
        frames.reserveCapacity(raw.count)
        for (frame, key) in zip(raw, keys) {
            for named in cache[key] ?? [unnamedFrame(frame.address)] {
                frames.append(named.with(isUncertain: frame.isUncertain))
            }
        }
        return frames
    }

    /// Symbolicates `keys` and fills the cache, one entry per key.
    ///
    /// Every address is handed to `Runtime` as an instruction address: a return
    /// address as the address before it (inside the call instruction, the line of
    /// the call), exactly the adjustment `Runtime` would make, so that each frame is
    /// found by the address it was asked for. A key the batch leaves unnamed is
    /// tried once more on its own; one that stays unnamed is cached only when it
    /// lies outside every image.
    private func resolve(_ keys: [Key], retrying: Bool = true) {
        func lookup(_ key: Key) -> UInt { key.isReturnAddress ? key.address &- 1 : key.address }
        var named = Set<Key>()
        let symbolicated = Self.runtimeAccess.withLock { _ in
            decodeBacktrace(keys.map(lookup)).flatMap { $0.symbolicated(with: images) }
        }
        if let symbolicated {
            var group: [StackFrame] = []
            for frame in symbolicated.frames {
                let original = UInt(frame.captured.originalProgramCounter) ?? 0
                let symbol = frame.symbol
                group.append(
                    StackFrame(
                        address: original,
                        function: symbol.map { $0.name },
                        file: symbol?.sourceLocation.flatMap { $0.line > 0 ? $0.path : nil },
                        line: symbol?.sourceLocation.flatMap { $0.line > 0 ? $0.line : nil },
                        image: symbol?.imageName,
                        isUncertain: false,
                        isInlined: frame.inlined))
                guard !frame.inlined else { continue }
                // A key's inlined frames, then its own: match the group to the first
                // key with this address that has no name yet (by address, not by
                // position, so that a frame the batch leaves out shifts nothing).
                if let key = keys.first(where: { lookup($0) == original && !named.contains($0) }) {
                    named.insert(key)
                    let offset = imageOffset(of: key.address)
                    cache[key] = group.map { $0.with(address: key.address, imageOffset: offset) }
                    if let symbol, symbol.offset >= 0 { starts[key] = original &- UInt(symbol.offset) }
                }
                group = []
            }
        }
        let unnamed = keys.filter { !named.contains($0) }
        if retrying && keys.count > 1 {
            for key in unnamed { resolve([key], retrying: false) }
        } else {
            for key in unnamed where images.indexOfImage(at: Backtrace.Address(UInt64(key.address))) == nil {
                cache[key] = [StackFrame(address: key.address, isUncertain: false)]
            }
        }
    }

    /// A frame `Runtime` could not name: its image and offset when an image holds
    /// it (not cached, so that a later stall tries again).
    private func unnamedFrame(_ address: UInt) -> StackFrame {
        guard let index = images.indexOfImage(at: Backtrace.Address(UInt64(address))) else {
            return StackFrame(address: address, isUncertain: false)
        }
        return StackFrame(
            address: address, function: nil, file: nil, line: nil, image: images[index].name, isUncertain: false,
            imageOffset: imageOffset(of: address))
    }

    /// `address` relative to the load address of the image it lies in.
    private func imageOffset(of address: UInt) -> UInt? {
        guard let index = images.indexOfImage(at: Backtrace.Address(UInt64(address))),
            let base = UInt(images[index].baseAddress)
        else { return nil }
        return address &- base
    }

    /// How many times the image map was taken again (a library loaded since):
    /// what is cached by code address elsewhere may be stale then.
    private(set) var imageGeneration = 0

    private func refreshImages() {
        imageGeneration += 1
        images = Self.processImages(refreshing: true)
        encodedImages = Self.encode(images)
        textRanges = Self.textRanges(images)
        fileTextRanges = Self.textRanges(images, of: "/")
        executableText = Self.textRanges(images, of: Self.executablePath)
    }

    /// The executable mappings from `/proc/self/maps`, but not writable ones.
    /// (An image's base to its end of text is not all mapped: reading a hole
    /// between its segments faults.)
    ///
    /// Writable and executable at once is not code here: the toolchain's
    /// `libswiftRuntime.so` (which symbolication links) asks for an executable
    /// stack (`GNU_STACK` RWE), so glibc maps every thread's stack `rwxp`, and as
    /// "text" every pointer into a stack passed for a possible return address (a
    /// JIT's writable code buffer would have no symbols either).
    private static func textRanges(_ images: ImageMap, of path: String? = nil) -> [(start: UInt, end: UInt)] {
        guard let maps = ProcFile.read("/proc/self/maps") else { return [] }
        var ranges: [(start: UInt, end: UInt)] = []
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", maxSplits: 2)
            guard fields.count >= 2, fields[1].count >= 3, fields[1].dropFirst(2).first == "x",
                fields[1].first == "r", fields[1].dropFirst().first != "w"
            else { continue }
            if let path {
                // A whole path, or "/" for any file.
                if path == "/" ? !line.contains(" /") : !line.hasSuffix(" " + path) { continue }
            }
            let bounds = fields[0].split(separator: "-")
            guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16)
            else { continue }
            ranges.append((start, end))
        }
        return ranges.sorted { $0.start < $1.start }
    }

    private static func encode(_ images: ImageMap) -> String {
        guard let data = try? JSONEncoder().encode(images) else { return "null" }
        return String(decoding: data, as: UTF8.self)
    }

    private func decodeBacktrace(_ addresses: [UInt]) -> Backtrace? {
        let frames = addresses.map { (address: $0, isReturnAddress: false) }
        let encoded = Data(CompactBacktrace.encode(frames)).base64EncodedString()
        #if arch(x86_64)
        let architecture = "x86_64"
        #elseif arch(arm64)
        let architecture = "arm64"
        #else
        let architecture = "unknown"
        #endif
        let json = "{\"architecture\":\"\(architecture)\",\"backtrace\":\"\(encoded)\",\"imageMap\":\(encodedImages)}"
        return try? JSONDecoder().decode(Backtrace.self, from: Data(json.utf8))
    }
}

#endif

/// The Compact Backtrace Format (version 0, 64-bit): a header byte, then per frame
/// an instruction byte `0001axxx` (pc) or `0010axxx` (return address) followed by
/// `xxx + 1` big-endian bytes of the difference from the previous address
/// (sign-extended), starting from zero.
enum CompactBacktrace {
    /// Encodes addresses, the first as the interrupted instruction, the others as
    /// return addresses.
    static func encode(_ addresses: [UInt]) -> [UInt8] {
        encode(addresses.enumerated().map { (address: $0.element, isReturnAddress: $0.offset > 0) })
    }

    /// Encodes frames of either kind.
    static func encode(_ frames: [(address: UInt, isReturnAddress: Bool)]) -> [UInt8] {
        var bytes: [UInt8] = [0b0000_0010]  // version 0, 64-bit words
        var previous: UInt64 = 0
        for frame in frames {
            let delta = Int64(bitPattern: UInt64(frame.address) &- previous)
            previous = UInt64(frame.address)
            var length = 8
            while length > 1 {
                let shift = Int64(8 * (length - 1))
                let truncated = (delta << (64 - shift)) >> (64 - shift)  // sign-extend the low bytes
                if truncated != delta { break }
                length -= 1
            }
            let opcode: UInt8 = frame.isReturnAddress ? 0b0010_0000 : 0b0001_0000
            bytes.append(opcode | UInt8(length - 1))
            for byteIndex in stride(from: length - 1, through: 0, by: -1) {
                bytes.append(UInt8(truncatingIfNeeded: delta >> Int64(8 * byteIndex)))
            }
        }
        bytes.append(0)  // end
        return bytes
    }
}

extension StackFrame {
    init(address: UInt, isUncertain: Bool) {
        self.init(address: address, function: nil, file: nil, line: nil, image: nil, isUncertain: isUncertain)
    }

    func with(address: UInt, imageOffset: UInt?) -> StackFrame {
        StackFrame(
            address: address, function: function, file: file, line: line, image: image, isUncertain: isUncertain,
            isInlined: isInlined, imageOffset: imageOffset)
    }

    func with(isUncertain: Bool) -> StackFrame {
        StackFrame(
            address: address, function: function, file: file, line: line, image: image, isUncertain: isUncertain,
            isInlined: isInlined, imageOffset: imageOffset)
    }
}
