import Runtime

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Turns raw addresses into named frames with the toolchain's `Runtime` module.
///
/// `Runtime.Backtrace` has no public initializer from addresses, but its `Codable`
/// form carries the addresses in the Compact Backtrace Format (a header byte, then
/// one instruction per frame); this builds that form and decodes it. The
/// `ImageMap` (the loaded images) is captured once and again only when an address
/// falls outside every known image, for instance after a `dlopen`: the first
/// symbolication costs tens of milliseconds, later ones about one.
///
/// Not thread-safe: one symbolicator belongs to one detector thread.
final class Symbolicator {
    private var images: ImageMap
    private var encodedImages: String

    init() {
        images = ImageMap.capture()
        encodedImages = Self.encode(images)
    }

    /// Symbolicates the current stack once, so that the first real stall does not
    /// pay for loading symbol tables and debug information.
    func warmUp() {
        if let here = try? Backtrace.capture(limit: 16) {
            _ = here.symbolicated(with: images)
        }
    }

    /// Whether `address` lies in the executable text of a loaded image.
    func isTextAddress(_ address: UInt) -> Bool {
        guard let index = images.indexOfImage(at: Backtrace.Address(UInt64(address))) else { return false }
        let image = images[images.index(images.startIndex, offsetBy: index)]
        return Backtrace.Address(UInt64(address)) < image.endOfText
    }

    /// Names the frames; unknown ones keep only their address.
    func symbolicate(_ raw: [RawFrame]) -> [StackFrame] {
        guard !raw.isEmpty else { return [] }
        if raw.contains(where: { images.indexOfImage(at: Backtrace.Address(UInt64($0.address))) == nil }) {
            refreshImages()
        }
        guard let backtrace = decodeBacktrace(raw.map(\.address)),
            let symbolicated = backtrace.symbolicated(with: images)
        else {
            return raw.map { StackFrame(address: $0.address, isUncertain: $0.isUncertain) }
        }
        // Inlined frames share their caller's address; map each back to its raw frame.
        var frames: [StackFrame] = []
        var rawIndex = -1
        for frame in symbolicated.frames {
            if !frame.inlined { rawIndex += 1 }
            let source = raw[min(max(rawIndex, 0), raw.count - 1)]
            let symbol = frame.symbol
            frames.append(
                StackFrame(
                    address: source.address,
                    function: symbol.map { $0.name },
                    file: symbol?.sourceLocation?.path,
                    line: symbol?.sourceLocation.map { $0.line },
                    image: symbol?.imageName,
                    isUncertain: source.isUncertain))
        }
        return frames
    }

    private func refreshImages() {
        images = ImageMap.capture()
        encodedImages = Self.encode(images)
    }

    private static func encode(_ images: ImageMap) -> String {
        guard let data = try? JSONEncoder().encode(images) else { return "null" }
        return String(decoding: data, as: UTF8.self)
    }

    private func decodeBacktrace(_ addresses: [UInt]) -> Backtrace? {
        let encoded = Data(CompactBacktrace.encode(addresses)).base64EncodedString()
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

/// The Compact Backtrace Format (version 0, 64-bit): a header byte, then per frame
/// an instruction byte `0001axxx` (pc) or `0010axxx` (return address) followed by
/// `xxx + 1` big-endian bytes of the difference from the previous address
/// (sign-extended), starting from zero.
enum CompactBacktrace {
    static func encode(_ addresses: [UInt]) -> [UInt8] {
        var bytes: [UInt8] = [0b0000_0010]  // version 0, 64-bit words
        var previous: UInt64 = 0
        for (index, address) in addresses.enumerated() {
            let delta = Int64(bitPattern: UInt64(address) &- previous)
            previous = UInt64(address)
            var length = 8
            while length > 1 {
                let shift = Int64(8 * (length - 1))
                let truncated = (delta << (64 - shift)) >> (64 - shift)  // sign-extend the low bytes
                if truncated != delta { break }
                length -= 1
            }
            let opcode: UInt8 = index == 0 ? 0b0001_0000 : 0b0010_0000
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
}
