import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A raw frame before symbolication.
struct RawFrame: Hashable, Sendable {
    var address: UInt
    /// Found only by the return-address scan.
    var isUncertain: Bool
    /// The signal return trampoline (`__restore_rt`), where a debugger shows
    /// `<signal handler called>`: the frame after it is the interrupted
    /// instruction itself, not a return address.
    var isSignalReturn = false
    /// A partial function an awaiting caller resumes in (``AsyncContextChain``):
    /// its first instruction, not a return address.
    var isAwaitResume = false
    /// No frame: where a profile's sample says its awaiting callers stop
    /// before the task's entry (``RawStack/profileFrames``); `address` holds
    /// the ``AsyncContextChain/Cut/code``.
    var isAwaitsCut = false

    init(address: UInt, isUncertain: Bool, isSignalReturn: Bool = false, isAwaitResume: Bool = false) {
        self.address = address
        self.isUncertain = isUncertain
        self.isSignalReturn = isSignalReturn
        self.isAwaitResume = isAwaitResume
    }

    /// The marker of a chain of awaits that stops at `cut`.
    static func awaitsCut(_ cut: AsyncContextChain.Cut) -> RawFrame {
        var marker = RawFrame(address: cut.code, isUncertain: false)
        marker.isAwaitsCut = true
        return marker
    }

    /// Whether the address follows a call (every frame but the first, the
    /// partial functions awaiting callers resume in and a cut's marker).
    func isReturnAddress(at index: Int) -> Bool { index > 0 && !isAwaitResume && !isAwaitsCut }
}
