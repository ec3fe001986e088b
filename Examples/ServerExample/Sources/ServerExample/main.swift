// A Hummingbird 2 server guarded by SafeTimers. See README.md beside Package.swift.
//
//   swift run ServerExample [--host 127.0.0.1] [--port 8080] [--stall-threshold-ms 100]
//       [--watchdog-ms 100] [--request-timeout-ms 5000] [--deadline-ms 2000] [--work-bytes 14336]
//       [--log-level info] [--executor eventloops|pool]
//
// Routes:
//   GET /                    what this server is
//   GET /slow?ms=400         blocks its event loop (mode=sleep, the default, or mode=spin)
//   GET /wait?ms=400         awaits (a slow upstream, say): past --deadline-ms it is
//                            cancelled and answered 504
//   GET /hash                the per-request work, under both guards
//   GET /traces              the request and stall spans finished since the last call
//   GET /bench/plain         the work, unguarded           } the routes bench.sh
//   GET /bench/watchdog      under withWatchdog            } compares: each has
//   GET /bench/delayed       under a DelayedWork timeout   } exactly one guard
//   GET /bench/gcd           under a DispatchSourceTimer   }

import Hummingbird
import InMemoryTracing
import Logging
import NIOCore
import NIOPosix
import StallDetectionTracing
import Tracing

let options: ServerOptions
do {
    options = try ServerOptions(arguments: Array(CommandLine.arguments.dropFirst()))
} catch {
    print("ServerExample: \(error)\n\n\(ServerOptions.usage)")
    exit(2)
}

LoggingSystem.bootstrap { label in
    var handler = StreamLogHandler.standardOutput(label: label)
    handler.logLevel = options.logLevel
    return handler
}
let logger = Logger(label: "ServerExample")

// Request handlers run on the event loops: NIO's loops become Swift concurrency's
// global executor (one thread hop less per request, as many NIO servers run). So a
// handler that blocks, blocks a loop, and every connection on that loop with it.
// Must happen before any task starts. (With `--executor pool`, handlers run on Swift
// concurrency's cooperative pool, Hummingbird's default: a blocking handler then
// blocks a pool thread, which these event-loop detectors do not watch.)
if options.handlersOnEventLoops
    && !NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
{
    logger.warning("could not run Swift concurrency on the event loops; handlers run on the cooperative pool")
}
let eventLoops = MultiThreadedEventLoopGroup.singleton

// Traces: every request of the application's routes gets a span, and stalls of an
// event loop are added to the spans of the requests in flight on it. The spans stay
// in memory until GET /traces takes them (production would bootstrap swift-otel).
let tracer = InMemoryTracer()
InstrumentationSystem.bootstrap(tracer)
let stallTracer = StallTracer(tracer: tracer)
let loopNames = EventLoopNames(group: eventLoops)

// One stall detector per event loop, run by the application's service group: they
// start with the server and stop after it on graceful shutdown.
let stallService = makeEventLoopStallService(
    loops: loopNames, threshold: .milliseconds(options.stallThresholdMilliseconds),
    logger: Logger(label: "ServerExample.stalls"), tracer: stallTracer)

let router = Router(context: ServerContext.self)
let workBytes = options.workBytes

// The application's routes: every request has a span, and is guarded by a watchdog that logs slow
// routes, by a hard request timeout that closes its connection, and by a deadline
// that cancels it and answers 504.
router.group()
    .add(middleware: RequestSpanMiddleware(stalls: stallTracer, loops: loopNames))
    .add(middleware: WatchdogMiddleware(milliseconds: options.watchdogMilliseconds))
    .add(middleware: RequestTimeoutMiddleware(milliseconds: options.requestTimeoutMilliseconds))
    .add(middleware: DeadlineMiddleware(milliseconds: options.deadlineMilliseconds))
    .get("/") { _, _ in
        "SafeTimers server example. Try /slow (blocks an event loop: see the stall report in the log).\n"
    }
    .get("/hash") { _, _ in "\(hashRequestWork(bytes: workBytes))\n" }
    .get("/wait") { request, _ in
        let milliseconds = request.uri.queryParameters.get("ms", as: Int.self) ?? 400
        try await Task.sleep(for: .milliseconds(milliseconds))
        return "waited \(milliseconds) ms\n"
    }
    .get("/slow") { request, context in
        let milliseconds = request.uri.queryParameters.get("ms", as: Int.self) ?? 400
        if request.uri.queryParameters.get("mode") == "spin" {
            let hash = spinEventLoopInSlowHandler(milliseconds: milliseconds)
            context.logger.info("the /slow handler returned after \(milliseconds) ms")
            return "spun \(hash)\n"
        }
        blockEventLoopInSlowHandler(milliseconds: milliseconds)
        context.logger.info("the /slow handler returned after \(milliseconds) ms")
        return "the /slow handler blocked its thread for \(milliseconds) ms\n"
    }

// The spans finished since the last call, one a line (not traced itself).
router.get("/traces") { _, _ in TraceLog.takeFinished(from: tracer) }

// The benchmark's routes: the same work, each under exactly one guard.
router.group("bench").get("plain") { _, _ in "\(hashRequestWork(bytes: workBytes))\n" }
router.group("bench")
    .add(middleware: WatchdogMiddleware(milliseconds: options.watchdogMilliseconds))
    .get("watchdog") { _, _ in "\(hashRequestWork(bytes: workBytes))\n" }
router.group("bench")
    .add(middleware: RequestTimeoutMiddleware(milliseconds: options.requestTimeoutMilliseconds))
    .get("delayed") { _, _ in "\(hashRequestWork(bytes: workBytes))\n" }
router.group("bench")
    .add(middleware: DispatchTimerGuardMiddleware(milliseconds: options.watchdogMilliseconds))
    .get("gcd") { _, _ in "\(hashRequestWork(bytes: workBytes))\n" }

let app = Application(
    router: router,
    configuration: .init(address: .hostname(options.host, port: options.port), serverName: "ServerExample"),
    services: [stallService],
    eventLoopGroupProvider: .shared(eventLoops),
    logger: logger
)
// Runs until SIGTERM or SIGINT, then shuts down gracefully.
try await app.runService()
