// swift-tools-version:6.2
//
// SafeTimers: time-based primitives that cannot crash, leak, or fire after cancel,
// and hang detection that says where a thread was stuck.
//
// The core product `SafeTimers` depends on the toolchain alone. Strict compiler
// flags (`-warnings-as-errors`) are applied by CI (`.ci/run`), never here: a package
// that sets `unsafeFlags` cannot be depended on.

import PackageDescription

let package = Package(
    name: "SafeTimers",
    platforms: [
        // The floor for `Synchronization.Mutex` and `Synchronization.Atomic`.
        .macOS(.v15), .iOS(.v18), .tvOS(.v18), .watchOS(.v11), .visionOS(.v2),
    ],
    products: [
        .library(name: "SafeTimers", targets: ["SafeTimers"]),
        .library(name: "SafeTimersTesting", targets: ["SafeTimersTesting"]),
        .library(name: "StallDetection", targets: ["StallDetection"]),
        // Opt-in: StallDetection events to swift-log and swift-metrics, and a
        // swift-service-lifecycle `Service` that runs detectors. The only product
        // with dependencies; the others use the toolchain alone.
        .library(name: "StallDetectionReporting", targets: ["StallDetectionReporting"]),
        .library(name: "StallDetectionTracing", targets: ["StallDetectionTracing"]),
        // For test targets: a Swift Testing trait and an XCTest assertion that fail
        // a test whose code stalls the main actor, an executor or the pool.
        .library(name: "StallDetectionTesting", targets: ["StallDetectionTesting"]),
        .executable(name: "safetimers-demo", targets: ["safetimers-demo"]),
        // Folded stacks (`StallProfile.foldedStacks()`) to a flame graph in SVG.
        .executable(name: "stall-flamegraph", targets: ["stall-flamegraph"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        // StallDetectionReporting's `StallDetectionService` (a `ServiceGroup` member).
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        // StallDetectionTracing's spans and events.
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.7.3"),
        // Tests only: SafeTimersTesting drives async-algorithms' `debounce` on its clock.
        // (Dependencies used only by test targets are not fetched by users.)
        .package(url: "https://github.com/apple/swift-async-algorithms", from: "1.1.4"),
    ],
    targets: [
        .target(name: "SafeTimers"),
        .target(name: "SafeTimersTesting", dependencies: ["SafeTimers"]),
        // The only C in the package: the async-signal-safe SIGPROF handler that
        // samples a blocked thread's stack.
        .target(name: "CStallCapture"),
        .target(name: "StallDetection", dependencies: ["SafeTimers", "CStallCapture"]),
        .target(
            name: "StallDetectionReporting",
            dependencies: [
                "SafeTimers", "StallDetection",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .target(
            name: "StallDetectionTracing",
            dependencies: [
                "SafeTimers", "StallDetection",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ]
        ),
        .target(name: "StallDetectionTesting", dependencies: ["StallDetection"]),
        .executableTarget(
            name: "safetimers-demo",
            dependencies: ["SafeTimers", "StallDetection"]
        ),
        .executableTarget(name: "stall-flamegraph"),
        // A child process for StallDetection's integration tests (not a product).
        .executableTarget(name: "stall-probe", dependencies: ["SafeTimers", "StallDetection"]),
        .testTarget(name: "SafeTimersTests", dependencies: ["SafeTimers", "SafeTimersTesting"]),
        .testTarget(
            name: "SafeTimersTestingTests",
            dependencies: [
                "SafeTimers", "SafeTimersTesting",
                .product(name: "AsyncAlgorithms", package: "swift-async-algorithms"),
            ]
        ),
        .testTarget(
            name: "StallDetectionTests",
            dependencies: ["StallDetection", "CStallCapture", "stall-probe", "stall-flamegraph"]
        ),
        .testTarget(
            name: "StallDetectionReportingTests",
            dependencies: [
                "StallDetectionReporting",
                .product(name: "InMemoryLogging", package: "swift-log"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .testTarget(name: "StallDetectionTestingTests", dependencies: ["StallDetectionTesting"]),
        .testTarget(
            name: "StallDetectionTracingTests",
            dependencies: [
                "StallDetectionTracing",
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
