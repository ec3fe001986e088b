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

    init(address: UInt, isUncertain: Bool, isSignalReturn: Bool = false, isAwaitResume: Bool = false) {
        self.address = address
        self.isUncertain = isUncertain
        self.isSignalReturn = isSignalReturn
        self.isAwaitResume = isAwaitResume
    }

    /// Whether the address follows a call (every frame but the first and the
    /// partial functions awaiting callers resume in).
    func isReturnAddress(at index: Int) -> Bool { index > 0 && !isAwaitResume }
}
