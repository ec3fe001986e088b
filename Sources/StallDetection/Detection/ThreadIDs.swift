import CStallCapture
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Thread ids as ``StallBacktrace/threadID`` gives them.
enum ThreadIDs {
    /// The calling thread's id: `gettid()` on Linux, `pthread_threadid_np` on Darwin.
    static func current() -> UInt64 {
        #if canImport(Darwin)
        var id: UInt64 = 0
        pthread_threadid_np(nil, &id)
        return id
        #else
        return UInt64(UInt32(bitPattern: stallcapture_current_tid()))
        #endif
    }
}
