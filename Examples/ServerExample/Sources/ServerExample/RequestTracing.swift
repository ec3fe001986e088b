import Hummingbird
import InMemoryTracing
import StallDetectionTracing
import Tracing

/// Gives every request a span, in flight on its connection's event loop for as long
/// as the request runs: a stall of that loop meanwhile is added to the span as
/// "stall started" / "stall ended" events (which loop, how long, the top frames of
/// its blocked stack), by `StallTracer`.
struct RequestSpanMiddleware: RouterMiddleware {
    typealias Context = ServerContext

    let stalls: StallTracer
    let loops: EventLoopNames

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let loop = loops.name(of: context.channel.eventLoop)
        return try await withSpan("\(request.method) \(request.uri.path)", ofKind: .server) { span in
            span.attributes["http.request.method"] = "\(request.method)"
            span.attributes["url.path"] = request.uri.path
            span.attributes["server.event_loop"] = loop
            return try await stalls.withSpan(span, inFlightOn: loop) {
                try await next(request, context)
            }
        }
    }
}

/// The spans this server finished, as text, one a line, for `GET /traces`. The
/// server keeps them in memory until that route takes them (a real server would
/// bootstrap an exporting tracer, swift-otel's, instead of `InMemoryTracer`).
enum TraceLog {
    static func takeFinished(from tracer: InMemoryTracer) -> String {
        tracer.popFinishedSpans().map(line).joined()
    }

    private static func line(_ span: FinishedInMemorySpan) -> String {
        let milliseconds =
            (span.endInstant.nanosecondsSinceEpoch &- span.startInstant.nanosecondsSinceEpoch) / 1_000_000
        var text = "span \"\(span.operationName)\" \(milliseconds) ms trace=\(span.traceID)"
        if let stallFrames = span.attributes["stall.top_frames"]?.toSpanAttribute() {
            text += " top_frames=\(plain(stallFrames))"
        }
        for event in span.events {
            var attributes: [String] = []
            event.attributes.forEach { key, value in attributes.append("\(key)=\(plain(value))") }
            attributes.sort()
            text += " | event \"\(event.name)\" \(attributes.joined(separator: " "))"
        }
        return text + "\n"
    }

    private static func plain(_ attribute: SpanAttribute) -> String {
        switch attribute {
        case .int64(let value): return "\(value)"
        case .string(let value): return value
        case .stringArray(let values): return "[\(values.joined(separator: "; "))]"
        default: return "\(attribute)"
        }
    }
}
