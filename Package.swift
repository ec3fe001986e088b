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
        .executable(name: "safetimers-demo", targets: ["safetimers-demo"]),
    ],
    targets: [
        .target(name: "SafeTimers"),
        .target(name: "SafeTimersTesting", dependencies: ["SafeTimers"]),
        .target(name: "StallDetection", dependencies: ["SafeTimers"]),
        .executableTarget(
            name: "safetimers-demo",
            dependencies: ["SafeTimers", "StallDetection"]
        ),
        .testTarget(name: "SafeTimersTests", dependencies: ["SafeTimers", "SafeTimersTesting"]),
        .testTarget(name: "SafeTimersTestingTests", dependencies: ["SafeTimers", "SafeTimersTesting"]),
    ],
    swiftLanguageModes: [.v6]
)
