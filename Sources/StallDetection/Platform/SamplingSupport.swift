/// Whether this platform has a stack sampler, and what every report says where
/// it has none. Apple platforms have none yet (the design it will follow is in
/// the article "Detecting hangs and stalls") and no kernel thread ids: every
/// thread there has id 0, the detector's own included, so no thread is looked
/// for and every target's report gives this reason.
enum SamplingSupport {
    #if os(Linux)
    static let isAvailable = true
    #else
    static let isAvailable = false
    #endif

    /// The reason a report gives for its missing stack where there is no sampler.
    static let unavailableReason = "stack sampling is not supported on this platform"

    /// A report's backtrace where there is no sampler.
    static var unavailable: StallBacktrace { .unavailable(unavailableReason) }
}
