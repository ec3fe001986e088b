#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The work every benchmark route does: FNV-1a over `bytes` of data, one dependent
/// step a byte (about 26 µs for the default 14 KiB in a release build on the 2-core
/// machine the README's table was measured on), so that a guard's cost is weighed
/// against a request that does something.
@inline(never)
func hashRequestWork(bytes: Int) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    var byte: UInt8 = 0x5a
    for _ in 0..<max(0, bytes) {
        hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
        byte = byte &+ UInt8(truncatingIfNeeded: hash >> 56) | 1
    }
    return hash
}

/// The handler of `/slow`: it blocks the thread it runs on, which in this server is
/// an event loop, for `milliseconds` (a synchronous sleep, the mistake a blocking
/// file read, lock or database driver makes). Every other connection on the same
/// loop waits with it; the loop's `StallDetector` reports it, and its report names
/// this function with its file and line.
@inline(never)
func blockEventLoopInSlowHandler(milliseconds: Int) {
    let clamped = min(max(0, milliseconds), 10_000)
    var remaining = timespec(tv_sec: clamped / 1000, tv_nsec: (clamped % 1000) * 1_000_000)
    // A signal may end the sleep early (EINTR): sleep again for what is left.
    var request = remaining
    while nanosleep(&request, &remaining) == -1 && errno == EINTR { request = remaining }
}

/// The handler of `/slow?mode=spin`: the same block, by computing instead of
/// sleeping (a loop over a large input, a regular expression gone quadratic).
@inline(never)
func spinEventLoopInSlowHandler(milliseconds: Int) -> UInt64 {
    let clamped = min(max(0, milliseconds), 10_000)
    let clock = ContinuousClock()
    let end = clock.now.advanced(by: .milliseconds(clamped))
    var hash: UInt64 = 0
    while clock.now < end {
        hash = hash &+ hashRequestWork(bytes: 4096)
    }
    return hash
}
