// Free names the documentation examples use, declared so that the examples
// type-check (see doc-examples.py). Nothing here runs.
import Dispatch
import Foundation
import SafeTimers
import SafeTimersTesting
import Logging
import ServiceLifecycle
import StallDetection
import StallDetectionReporting
import StallDetectionTracing
import StallDetectionTesting
import Tracing
import Synchronization
import Testing

func refresh() {}
func sendEvents() {}
func save() {}
func report() {}
func report(_ message: String) {}
func ping() {}
func done() {}
func alarm() {}
func log(_ message: String) {}
func search(_ query: String) -> [String] { [] }
func syncEverything() throws {}

func decode() async throws -> Data { Data() }
func fetch() async throws -> Data { Data() }
func fetchPage() async throws -> Data { Data() }
func fetchProfile() async throws -> Data { Data() }
func fetchFirstPage() async throws -> Data { Data() }
func fetchSecondPage() async throws -> Data { Data() }
func showOfflineBanner() {}
func show(_ value: Data) {}
let query = ""
let sql = ""
struct Log { func warning(_ message: String) {} }
let log = Log()
let logger = Log()
struct MetricsStub { func record(_ duration: Duration) {} }
let metrics = MetricsStub()
let detector = StallDetector(target: .mainQueue)
struct Database { func query(_ sql: String) throws -> [String] { [] } }
let database = Database()
struct Decoder { func decode(_ data: Data) async throws -> Data { data } }
let decoder = Decoder()
let data = Data()
struct API { func fetchProfile() async throws -> Data { Data() } }
let api = API()
struct Channel: Sendable {
    var eventLoop: EventLoopStandIn { EventLoopStandIn() }
    func close(promise: Int?) {}
}
let channel = Channel()
@MainActor final class View {
    var isHidden = false
    var text = ""
    func show(_ results: [String]) {}
    func update(_ progress: Double) {}
    func showSlowNetworkHint() {}
}
@MainActor let banner = View()
@MainActor let resultsView = View()
@MainActor let progressView = View()
@MainActor let spinner = View()
@MainActor let clockLabel = View()
@MainActor let label = View()
let progress = 0.5
let formatter = DateFormatter()
func now() -> String { "" }
let debouncer = Debouncer(delay: .seconds(1))
let throttler = Throttler(interval: .seconds(1))
let heartbeat = RepeatingTimer(interval: .seconds(30)) {}
final class WallInteractor: Sendable { func fetchWallPosts() {} }
let interactor = WallInteractor()
let queue = DispatchQueue(label: "examples")
let manualScheduler = ManualTimerScheduler()
/// Stands in for a SwiftNIO `EventLoop` (`execute` has NIO's signature); the
/// package does not depend on NIO.
final class EventLoopStandIn: Sendable {
    func execute(_ task: @escaping @Sendable () -> Void) { task() }
    /// NIO's `EventLoop.executor`.
    var executor: any SerialExecutor { SerialExecutorStandIn() }
}
final class SerialExecutorStandIn: SerialExecutor { func enqueue(_ job: consuming ExecutorJob) {} }
let eventLoop = EventLoopStandIn()
let loop = eventLoop
let eventLoops = [EventLoopStandIn(), EventLoopStandIn()]
/// Stands in for a server's swift-service-lifecycle `Service`.
struct ServerStandIn: Service { func run() async throws {} }
let server = ServerStandIn()
func renderPage() -> String { "" }
// A server framework's request, context and response (Hummingbird's names).
struct Request: Sendable {}
struct Context: Sendable {}
struct Response: Sendable {
    enum Status { case gatewayTimeout }
    init(status: Status) {}
}
let request = Request()
let context = Context()
func next(_ request: Request, _ context: Context) async throws -> Response { Response(status: .gatewayTimeout) }
// StallDetection: profiles, activities, fatal reports.
func layoutFeed() {}
func layOutThumbnails() {}
func upload<Report>(_ report: Report) {}
let cachesDirectory = NSTemporaryDirectory()
struct ContactsDatabase { func fetchAll() throws -> [String] { [] } }
let db = ContactsDatabase()

/// The trait's and XCTest helper's examples lay out a gallery.
final class Gallery: Sendable { func layOut() {} }
let gallery = Gallery()
