import SafeTimers

/// One frame of a ``StallBacktrace``.
public struct StackFrame: Sendable, Hashable, CustomStringConvertible {
    /// The instruction address (for all but the first frame, a return address). A
    /// frame inlined into another has that frame's address.
    public let address: UInt
    /// The demangled function name, when the image has symbols.
    public let function: String?
    /// The source file, when the image has debug information.
    public let file: String?
    /// The source line, when known.
    public let line: Int?
    /// The image (executable or library) name.
    public let image: String?
    /// True for a frame found only by scanning the stack for return addresses: it
    /// is probably, not certainly, part of the live call chain. Such frames appear
    /// only beyond the point where the certain chain broke off.
    public let isUncertain: Bool
    /// True for a function the compiler inlined into the next frame of the list
    /// (which has the same address).
    public let isInlined: Bool
    /// ``address`` relative to the load address of ``image``, when the image is
    /// known: what offline symbolication needs (`llvm-symbolizer --obj=<image>
    /// 0x<offset>`, or `atos` with a dSYM on Apple platforms, where the report
    /// carries raw addresses with image names and offsets).
    public let imageOffset: UInt?
    /// True for an async function awaiting the call of the frame before it in
    /// the list: a caller that is not on the thread's stack (an `await` is a
    /// tail call) but in the task's chain of async contexts. ``address`` is then
    /// where the caller resumes when that call returns, and ``line`` that
    /// point's line (the `await`, where the debug information says). Shown as
    /// `[await]` in text.
    public let isAwaiting: Bool

    init(
        address: UInt, function: String?, file: String?, line: Int?, image: String?, isUncertain: Bool,
        isInlined: Bool = false, imageOffset: UInt? = nil, isAwaiting: Bool = false
    ) {
        self.address = address
        self.function = function
        self.file = file
        self.line = line
        self.image = image
        self.isUncertain = isUncertain
        self.isInlined = isInlined
        self.imageOffset = imageOffset
        self.isAwaiting = isAwaiting
    }

    /// `0x… function at file:line (image)`, `[inlined]` for an inlined frame,
    /// `[await]` for an awaiting caller, `?`
    /// for an uncertain one; a frame without a name shows its image offset,
    /// `0x… <unknown> (image + 0x1f2c)`.
    public var description: String {
        var text = "0x" + String(address, radix: 16).leftPadded(to: 12)
        text += " " + (function ?? "<unknown>")
        if let file {
            text += " at \(file)"
            if let line { text += ":\(line)" }
        }
        if let image {
            if function == nil, let imageOffset {
                text += " (\(image) + 0x\(String(imageOffset, radix: 16)))"
            } else {
                text += " (\(image))"
            }
        }
        if isInlined { text += " [inlined]" }
        if isAwaiting { text += " [await]" }
        if isUncertain { text += " ?" }
        return text
    }

    /// The same call site: a recursion's repeated frame.
    func sameCall(as other: StackFrame) -> Bool {
        address == other.address && function == other.function && line == other.line
            && isInlined == other.isInlined && isUncertain == other.isUncertain && isAwaiting == other.isAwaiting
    }
}
