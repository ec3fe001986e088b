import SafeTimers
import StallDetection
import Tracing

/// Records stalls in traces, through swift-distributed-tracing: a span for each
/// stall, and events on the spans of requests that were in flight on the
/// stalled target.
///
/// Give ``record(_:)`` to a detector as its `onEvent` handler, and run each
/// request under `withSpan(_:inFlightOn:)` with the target of the
/// detector that watches where the request runs (for a SwiftNIO server: the
/// detector of the request's event loop):
///
/// ```swift
/// let stalls = StallTracer()   // InstrumentationSystem.tracer, once bootstrapped
/// let detector = StallDetector(
///     target: .custom(name: "event loop 0") { probe in loop.execute(probe) },
///     threshold: .milliseconds(100), onEvent: stalls.record)
///
/// // In a middleware, around the request's work:
/// try await withSpan("GET /users") { span in
///     try await stalls.withSpan(span, inFlightOn: "event loop 0") { try await next(request, context) }
/// }
/// ```
///
/// A trace then shows, on the request's span, "stall started" and "stall ended"
/// events (the target, how long it was blocked, the top frames of the blocked
/// thread's stack, and in `stall.task` the Swift task it ran, when known), and beside it the stall's own span, "stall: event loop 0",
/// from when the target stopped answering to when it answered again, with the
/// profile's busiest functions and the activities that were running.
///
/// Exporting the spans (to an OpenTelemetry collector through swift-otel, say) is
/// the tracer's business: bootstrap it as usual; nothing here depends on it.
public final class StallTracer: Sendable {
    private let tracer: any Tracer
    private let frameCount: Int
    private let state = StateLock<StallTracerState>(StallTracerState())

    /// Creates a recorder.
    ///
    /// - Parameters:
    ///   - tracer: Where spans and events go; the default is the bootstrapped
    ///     `InstrumentationSystem.tracer`.
    ///   - topFrameCount: How many frames of the blocked thread's stack (and of the
    ///     profile's functions) a span or event names; at least 1.
    public init(tracer: any Tracer = InstrumentationSystem.tracer, topFrameCount: Int = 5) {
        self.tracer = tracer
        frameCount = max(1, topFrameCount)
    }

    /// Records one stall event: a detector's `onEvent` handler.
    ///
    /// At `.started`, every span in flight on the event's target gets a "stall
    /// started" event. At `.ended`, every span still in flight there gets a
    /// "stall ended" event, and a span for the whole stall is recorded. A
    /// detector that saw a stall only at its end (no `.started`) is recorded the
    /// same way at `.ended`.
    ///
    /// A detector stopped during a stall ends it with an `.ended` event marked
    /// `StallEvent.endedByStop` (the time blocked until the stop): the stall's
    /// span and the "stall ended" events then end there, with the attribute
    /// `stall.ended_by_stop` set to true, and later requests on that target (on a
    /// detector started again with the same target too) see no stall going on.
    public func record(_ event: StallEvent) {
        let now = DefaultTracerClock.now.nanosecondsSinceEpoch
        // A `.started` event is handed over once the stack is sampled, that long
        // after the duration it carries was measured.
        let age = nanoseconds(event.duration) + (event.phase == .started ? nanoseconds(event.samplingTime) : 0)
        let start = now - min(now, UInt64(age))
        let stall = StallTracerState.Stall(id: event.id, startNanoseconds: start, topFrames: topFrames(of: event))
        switch event.phase {
        case .started:
            let spans = state.withLock { $0.stallStarted(stall, on: event.target) }
            let spanEvent = requestEvent("stall started", event, stall, at: start)
            for span in spans { span.addEvent(spanEvent) }
        case .ended:
            let spans = state.withLock { $0.stallEnded(on: event.target) }
            let spanEvent = requestEvent("stall ended", event, stall, at: now)
            for span in spans { span.addEvent(spanEvent) }
            recordStallSpan(event, startNanoseconds: start, endNanoseconds: now)
        }
    }

    /// Runs `body` with `span` in flight on `target`: stalls of `target` that
    /// happen meanwhile are added to it as events. A request that arrives during
    /// a stall gets its "stall started" event when it begins; one that ends during
    /// a stall gets a "stall still going" event (how long so far) when it ends.
    ///
    /// - Parameters:
    ///   - span: The request's span (or any span to annotate).
    ///   - target: The ``StallEvent/target`` text of the stall events to watch
    ///     for, which is the detector's `target.description`: "event loop 0" for
    ///     `.custom(name: "event loop 0")`, "queue 'db'" for a queue labelled "db",
    ///     "main queue". The overload taking a `StallDetector` reads it from the
    ///     detector.
    ///   - body: The request's work.
    public func withSpan<Result>(
        _ span: any Span,
        inFlightOn target: String,
        isolation: isolated (any Actor)? = #isolation,
        _ body: () async throws -> Result
    ) async rethrows -> Result {
        let (token, ongoing) = state.withLock { $0.add(span, on: target) }
        if let ongoing {
            span.addEvent(
                SpanEvent(
                    name: "stall started", at: Instant(ongoing.startNanoseconds),
                    attributes: attributes(ongoing, target)))
        }
        defer {
            if let ongoing = state.withLock({ $0.remove(token, on: target) }) {
                let now = DefaultTracerClock.now.nanosecondsSinceEpoch
                var attributes = attributes(ongoing, target)
                attributes["stall.blocked_ms"] = Int((now - min(now, ongoing.startNanoseconds)) / 1_000_000)
                span.addEvent(SpanEvent(name: "stall still going", at: Instant(now), attributes: attributes))
            }
        }
        return try await body()
    }

    /// Runs `body` with `span` in flight on what `detector` watches: the
    /// overload taking the target's text, with `detector.target.description`.
    public func withSpan<Result>(
        _ span: any Span,
        inFlightOn detector: StallDetector,
        isolation: isolated (any Actor)? = #isolation,
        _ body: () async throws -> Result
    ) async rethrows -> Result {
        try await withSpan(span, inFlightOn: detector.target.description, body)
    }

    private func recordStallSpan(_ event: StallEvent, startNanoseconds: UInt64, endNanoseconds: UInt64) {
        let span = tracer.startSpan(
            "stall: \(event.target)", context: .topLevel, ofKind: .internal, at: Instant(startNanoseconds),
            function: #function, file: #fileID, line: #line)
        span.attributes["stall.id"] = Int(truncatingIfNeeded: event.id)
        span.attributes["stall.target"] = event.target
        span.attributes["stall.duration_ms"] = Int(nanoseconds(event.duration) / 1_000_000)
        span.attributes["stall.threshold_ms"] = Int(nanoseconds(event.threshold) / 1_000_000)
        span.attributes["stall.top_frames"] = topFrames(of: event)
        span.attributes["stall.profile.samples"] = event.profile.sampleCount
        span.attributes["stall.profile.top_functions"] = event.profile.functions.prefix(frameCount).map {
            "\($0.name) (\($0.samples) samples)"
        }
        if !event.activities.isEmpty { span.attributes["stall.activities"] = event.activities }
        if let task = event.backtrace.task { span.attributes["stall.task"] = describe(task, event.backtrace) }
        if event.endedByStop { span.attributes["stall.ended_by_stop"] = true }
        span.end(at: Instant(endNanoseconds))
    }

    private func requestEvent(
        _ name: String, _ event: StallEvent, _ stall: StallTracerState.Stall, at nanoseconds: UInt64
    ) -> SpanEvent {
        var attributes = attributes(stall, event.target)
        attributes[event.phase == .ended ? "stall.duration_ms" : "stall.blocked_ms"] =
            Int(self.nanoseconds(event.duration) / 1_000_000)
        if !event.activities.isEmpty { attributes["stall.activities"] = event.activities }
        if let task = event.backtrace.task { attributes["stall.task"] = describe(task, event.backtrace) }
        if event.endedByStop { attributes["stall.ended_by_stop"] = true }
        return SpanEvent(name: name, at: Instant(nanoseconds), attributes: attributes)
    }

    /// The blocked thread's task and its parents, as a report's "task:" line
    /// shows them.
    private func describe(_ task: StallTask, _ backtrace: StallBacktrace) -> String {
        ([task] + backtrace.parentTasks).map(\.description).joined(separator: " ← ")
    }

    private func attributes(_ stall: StallTracerState.Stall, _ target: String) -> SpanAttributes {
        var attributes = SpanAttributes()
        attributes["stall.id"] = Int(truncatingIfNeeded: stall.id)
        attributes["stall.target"] = target
        attributes["stall.top_frames"] = stall.topFrames
        return attributes
    }

    /// The top frames of the blocked thread's stack that have a source file (the
    /// application's code, not the C library's sleep it is in), as "function
    /// (file:line)"; the top named frames when none has one.
    private func topFrames(of event: StallEvent) -> [String] {
        let named = event.backtrace.frames.filter { $0.function != nil }
        let withSource = named.filter { $0.file != nil }
        return (withSource.isEmpty ? named : withSource).prefix(frameCount).map { frame in
            let function = frame.function ?? "?"
            guard let file = frame.file else { return function }
            let name = file.split(separator: "/").last.map(String.init) ?? file
            return frame.line.map { "\(function) (\(name):\($0))" } ?? "\(function) (\(name))"
        }
    }

    private func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return max(0, seconds) * 1_000_000_000 + max(0, attoseconds) / 1_000_000_000
    }

    /// A point in time for the tracer: nanoseconds since the epoch.
    private struct Instant: TracerInstant {
        let nanosecondsSinceEpoch: UInt64
        init(_ nanoseconds: UInt64) { nanosecondsSinceEpoch = nanoseconds }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.nanosecondsSinceEpoch < rhs.nanosecondsSinceEpoch }
    }
}
