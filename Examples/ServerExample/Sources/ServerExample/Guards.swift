import Dispatch
import Hummingbird
import Logging
import NIOCore
import SafeTimers

/// The request context of this server: Hummingbird's basic one, plus the request's
/// channel, so that a request timeout can close the connection.
struct ServerContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    /// The connection the request came on; closing it ends the request for the client.
    let channel: any Channel

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        channel = source.channel
    }
}

/// Guards every request with `withWatchdog`: a request that runs longer than
/// `timeout` is logged (route, method, time allowed) while it is still running, from
/// SafeTimers' engine, whatever the request is doing.
///
/// The cost when the request is fast: one deadline armed and cancelled on the engine
/// (no allocation of a dispatch source, no thread hop).
struct WatchdogMiddleware: RouterMiddleware {
    typealias Context = ServerContext

    /// The time a request may take, in milliseconds.
    let milliseconds: Int
    var timeout: Duration { .milliseconds(milliseconds) }

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let logger = context.logger
        let milliseconds = milliseconds
        let route = "\(request.method) \(request.uri.path)"
        return try await withWatchdog(
            timeout: timeout,
            onTimeout: {
                logger.warning(
                    "slow route: \(route) is still running after \(milliseconds) ms",
                    metadata: ["route": "\(route)", "timeout_ms": "\(milliseconds)"])
            }
        ) {
            try await next(request, context)
        }
    }
}

/// A hard request timeout made of `DelayedWork`: armed when the request arrives,
/// cancelled when the response is ready. If it fires, it logs the request and closes
/// its connection, so the client is not left waiting (the handler's own work is not
/// cancelled: to cancel it, use `withTimeout`, which costs a child task per request).
struct RequestTimeoutMiddleware: RouterMiddleware {
    typealias Context = ServerContext

    /// The time a request may take, in milliseconds.
    let milliseconds: Int
    var timeout: Duration { .milliseconds(milliseconds) }

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let logger = context.logger
        let milliseconds = milliseconds
        let channel = context.channel
        let route = "\(request.method) \(request.uri.path)"
        // On the request's own event loop: the expiry runs there, in order with the
        // connection's other work, with no dispatch queue in between.
        let expiry = DelayedWork.schedule(after: timeout, executor: channel.eventLoop.executor) {
            logger.error(
                "request timeout: \(route) took longer than \(milliseconds) ms; closing its connection",
                metadata: ["route": "\(route)", "timeout_ms": "\(milliseconds)"])
            channel.close(promise: nil)
        }
        // A cancel that never waits: this runs where the server's tasks run, and
        // `cancel()` would wait there if the expiry's closure were running right now on
        // another thread. If it is (`.running`), it only logs and closes the connection.
        defer { expiry.cancelWithoutWaiting() }
        return try await next(request, context)
    }
}

/// A deadline that cancels the request's work: `next` (non-escaping, not `Sendable`)
/// runs under `withTimeout`; past the deadline its awaits throw `CancellationError`,
/// and the client gets 504 on the same connection (only the work is cancelled, not
/// the connection's task).
struct DeadlineMiddleware: RouterMiddleware {
    typealias Context = ServerContext

    /// The time a request may take, in milliseconds.
    let milliseconds: Int

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        do {
            return try await withTimeout(.milliseconds(milliseconds)) {
                try await next(request, context)
            }
        } catch is TimeoutError {
            context.logger.warning(
                "deadline: \(request.method) \(request.uri.path) cancelled after \(milliseconds) ms; answered 504",
                metadata: ["route": "\(request.method) \(request.uri.path)", "deadline_ms": "\(milliseconds)"])
            return Response(
                status: .gatewayTimeout,
                body: ResponseBody(byteBuffer: ByteBuffer(string: "deadline of \(milliseconds) ms passed\n")))
        }
    }
}

/// The classic guard, for comparison: one `DispatchSourceTimer` per request, created,
/// scheduled, resumed and cancelled around the handler.
struct DispatchTimerGuardMiddleware: RouterMiddleware {
    typealias Context = ServerContext

    /// The time a request may take, in milliseconds.
    let milliseconds: Int
    var timeout: Duration { .milliseconds(milliseconds) }

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let logger = context.logger
        let milliseconds = milliseconds
        let route = "\(request.method) \(request.uri.path)"
        let timer = DispatchSource.makeTimerSource(queue: .global())
        timer.schedule(deadline: .now() + .milliseconds(milliseconds))
        timer.setEventHandler {
            logger.warning("slow route (GCD guard): \(route) is still running after \(milliseconds) ms")
        }
        timer.resume()
        defer { timer.cancel() }
        return try await next(request, context)
    }
}
