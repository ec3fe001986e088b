import CStallCapture

/// A raw frame before symbolication.
struct RawFrame: Equatable, Sendable {
    var address: UInt
    /// Found only by the return-address scan.
    var isUncertain: Bool
}

/// Samples another thread's stack through the C signal handler and merges the three
/// unwinds it makes possible into one list, innermost first:
///
/// 1. glibc's unwinder (`backtrace()`, run in the handler), which follows DWARF
///    unwind tables through libc and Dispatch frames;
/// 2. a frame-pointer walk over the copied stack, which reaches Swift frames the
///    unwinder lost;
/// 3. a scan of the copied stack for words that are return addresses (they point
///    into an image's text right after a call instruction), which finds callers of
///    frames that have neither unwind tables nor frame pointers. Frames only the
///    scan found are marked uncertain.
///
/// Each frame is placed by the stack slot where its return address lives, so the
/// merged list is in call order whatever found it.
///
/// Not thread-safe: one sampler belongs to one detector thread.
final class StackSampler {
    enum Outcome {
        case frames([RawFrame])
        case unavailable(String)
    }

    private let sample: UnsafeMutablePointer<stallcapture_sample>
    private let timeoutMilliseconds: Int32

    init(timeout: Duration) {
        sample = .allocate(capacity: 1)
        let (seconds, attoseconds) = timeout.components
        timeoutMilliseconds = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    }

    deinit {
        sample.deallocate()
    }

    /// Installs the process-wide signal handler; returns an error text on failure.
    static func install() -> String? {
        let result = stallcapture_install()
        return result == 0 ? nil : "cannot install the SIGPROF handler (errno \(result))"
    }

    /// Samples thread `tid`; `isTextAddress` tells whether an address lies in an
    /// image's executable text (for the scan).
    func capture(thread tid: Int32, isTextAddress: (UInt) -> Bool) -> Outcome {
        var errorNumber: Int32 = 0
        let result = stallcapture_capture(tid, timeoutMilliseconds, sample, &errorNumber)
        switch Int(result) {
        case Int(STALLCAPTURE_OK):
            return .frames(merge(isTextAddress: isTextAddress))
        case Int(STALLCAPTURE_TIMEOUT):
            return .unavailable("thread \(tid) did not answer within \(timeoutMilliseconds) ms")
        case Int(STALLCAPTURE_SIGNAL_FAILED):
            return .unavailable("cannot signal thread \(tid) (errno \(errorNumber))")
        case Int(STALLCAPTURE_UNSUPPORTED):
            return .unavailable("stack sampling is not supported on this platform")
        default:
            return .unavailable("the SIGPROF handler is not installed")
        }
    }

    private func merge(isTextAddress: (UInt) -> Bool) -> [RawFrame] {
        let pc = UInt(sample.pointee.pc)
        let sp = UInt(sample.pointee.sp)
        let stackSize = Int(sample.pointee.stack_size)
        let stackBytes = UnsafeRawBufferPointer(
            start: stallcapture_sample_stack(sample), count: Int(STALLCAPTURE_STACK_BYTES))
        do {
            let words = stackBytes.bindMemory(to: UInt.self)
            let wordCount = min(stackSize, stackBytes.count) / MemoryLayout<UInt>.size
            func word(at address: UInt) -> UInt? {
                guard address >= sp, address % UInt(MemoryLayout<UInt>.size) == 0 else { return nil }
                let index = Int((address - sp) / UInt(MemoryLayout<UInt>.size))
                return index < wordCount ? words[index] : nil
            }
            // Certain frames by the slot that holds their return address.
            var bySlot: [Int: RawFrame] = [:]
            var unplaced: [RawFrame] = []

            // 1. The unwinder: skip the handler's own frames, up to the interrupted pc.
            let unwound = UnsafeBufferPointer(
                start: stallcapture_sample_unwound(sample), count: Int(sample.pointee.unwound_count)
            ).map { UInt($0) }
            if let start = unwound.firstIndex(of: pc) {
                var searchFrom = 0
                for address in unwound[(start + 1)...] {
                    if let slot = (searchFrom..<wordCount).first(where: { words[$0] == address }) {
                        bySlot[slot] = RawFrame(address: address, isUncertain: false)
                        searchFrom = slot + 1
                    } else {
                        unplaced.append(RawFrame(address: address, isUncertain: false))
                    }
                }
            }

            // 2. The frame-pointer chain.
            var framePointer = UInt(sample.pointee.fp)
            for _ in 0..<128 {
                guard let savedFramePointer = word(at: framePointer),
                    let returnAddress = word(at: framePointer + UInt(MemoryLayout<UInt>.size)),
                    returnAddress != 0
                else { break }
                let slot = Int((framePointer - sp) / UInt(MemoryLayout<UInt>.size)) + 1
                if bySlot[slot] == nil, isTextAddress(returnAddress) {
                    bySlot[slot] = RawFrame(address: returnAddress, isUncertain: false)
                }
                guard savedFramePointer > framePointer else { break }
                framePointer = savedFramePointer
            }

            // 3. The scan: every word of the copy. StackShape.prune keeps its
            // findings only where the certain chain broke off.
            for slot in 0..<wordCount where bySlot[slot] == nil {
                let candidate = words[slot]
                if isTextAddress(candidate) && Self.followsCall(candidate) {
                    bySlot[slot] = RawFrame(address: candidate, isUncertain: true)
                }
            }

            var frames = [RawFrame(address: pc, isUncertain: false)]
            for slot in bySlot.keys.sorted() {
                let frame = bySlot[slot]!
                if frames.last?.address != frame.address { frames.append(frame) }
            }
            for frame in unplaced where !frames.contains(where: { $0.address == frame.address }) {
                frames.append(frame)
            }
            return frames
        }
    }

    /// Whether the instruction before `address` is a call, so that `address` is a
    /// plausible return address. `address` must lie in mapped text.
    static func followsCall(_ address: UInt) -> Bool {
        #if arch(x86_64)
        guard address > 7, let code = UnsafePointer<UInt8>(bitPattern: address - 7) else { return false }
        // The caller checked `address`; the bytes before it are in the same text
        // unless `address` is within 7 bytes of the text start, which a return
        // address never is.
        // call rel32: E8 xx xx xx xx
        if code[2] == 0xE8 { return true }
        // call r/m64: FF /2, with 2 to 7 bytes of operand encoding.
        for length in 2...7 {
            let opcodeIndex = 7 - length
            let modrm = code[opcodeIndex + 1]
            if code[opcodeIndex] == 0xFF && (modrm >> 3) & 0x7 == 2 { return true }
        }
        return false
        #elseif arch(arm64)
        guard address >= 4, address % 4 == 0, let code = UnsafePointer<UInt32>(bitPattern: address - 4) else {
            return false
        }
        let instruction = code.pointee
        return instruction & 0xFC00_0000 == 0x9400_0000  // BL
            || instruction & 0xFFFF_FC1F == 0xD63F_0000  // BLR
        #else
        return true
        #endif
    }
}
