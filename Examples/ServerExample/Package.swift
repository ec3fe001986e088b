// swift-tools-version:6.2
//
// A Hummingbird 2 server that uses SafeTimers the way a server would: every request
// guarded by `withWatchdog`, a request timeout made of `DelayedWork`, and one
// `StallDetector` per SwiftNIO event loop that reports (through swift-log) a handler
// that blocks its loop, with the handler's stack.
//
// A package of its own, so that users of SafeTimers never fetch Hummingbird: the
// root package does not know this one exists.

import PackageDescription

let package = Package(
    name: "ServerExample",
    platforms: [.macOS(.v15)],
    dependencies: [
        // By path, as an app beside a checkout would; `name:` keeps the identity whatever
        // the checkout's folder is called.
        .package(name: "SafeTimers", path: "../.."),
        // No traits: the example needs neither swift-configuration nor full Foundation,
        // and skipping them shortens the first build.
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: []),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.7.3"),
    ],
    targets: [
        .executableTarget(
            name: "ServerExample",
            dependencies: [
                .product(name: "SafeTimers", package: "SafeTimers"),
                .product(name: "StallDetection", package: "SafeTimers"),
                .product(name: "StallDetectionReporting", package: "SafeTimers"),
                .product(name: "StallDetectionTracing", package: "SafeTimers"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        )
    ],
    swiftLanguageModes: [.v6]
)
