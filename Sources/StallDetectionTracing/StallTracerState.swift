import Tracing

/// What a ``StallTracer`` knows: the spans in flight on each target, and the
/// stall going on at each target. A pure value, changed under the tracer's lock;
/// the spans are annotated outside it.
struct StallTracerState {
    /// A stall as the spans it touches are told about it.
    struct Stall: Sendable {
        let id: UInt64
        /// When the target stopped answering, nanoseconds since the epoch.
        let startNanoseconds: UInt64
        let topFrames: [String]
    }

    private var inFlight: [String: [UInt64: any Span]] = [:]
    private var ongoing: [String: Stall] = [:]
    private var nextToken: UInt64 = 0

    /// `span` is in flight on `target`: its token, and the stall going on there.
    mutating func add(_ span: any Span, on target: String) -> (token: UInt64, ongoing: Stall?) {
        nextToken += 1
        inFlight[target, default: [:]][nextToken] = span
        return (nextToken, ongoing[target])
    }

    /// The span of `token` is no longer in flight: the stall going on there.
    mutating func remove(_ token: UInt64, on target: String) -> Stall? {
        inFlight[target]?[token] = nil
        if inFlight[target]?.isEmpty == true { inFlight[target] = nil }
        return ongoing[target]
    }

    /// A stall of `target` started: the spans in flight there.
    mutating func stallStarted(_ stall: Stall, on target: String) -> [any Span] {
        ongoing[target] = stall
        return inFlight[target].map { Array($0.values) } ?? []
    }

    /// A stall of `target` ended: the spans in flight there.
    mutating func stallEnded(on target: String) -> [any Span] {
        ongoing[target] = nil
        return inFlight[target].map { Array($0.values) } ?? []
    }
}
