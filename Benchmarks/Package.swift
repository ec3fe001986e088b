// swift-tools-version:6.1
//
// SafeTimers' benchmarks, in a package of their own so that users of SafeTimers
// never fetch benchmark dependencies.
//
//   swift run -c release safetimers-compare        one side-by-side table with ratios
//   swift package benchmark                         ordo-one/benchmark suites (allocation counts,
//                                                   percentiles)
//
// Every row runs SafeTimers and what users would pick instead (GCD, Foundation
// `Timer`, swift-nio, `Task.sleep`) on the same work, in the same process.

import PackageDescription

let package = Package(
    name: "SafeTimersBenchmarks",
    platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .watchOS(.v11), .visionOS(.v2)],
    dependencies: [
        .package(name: "SafeTimers", path: ".."),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        // Reads glibc's allocator counters (mallinfo2), which Swift's Glibc module
        // does not expose; benchmarks only.
        .target(name: "CMallocStats"),
        .executableTarget(
            name: "safetimers-compare",
            dependencies: [
                .product(name: "SafeTimers", package: "SafeTimers"),
                .product(name: "SafeTimersTesting", package: "SafeTimers"),
                .product(name: "StallDetection", package: "SafeTimers"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                "CMallocStats",
            ]
        ),
        // A stall in a process the size of a server (SwiftNIO linked and running,
        // 64 to 1,000 idle threads): `Benchmarks/stall-rates.sh --server` and CI's
        // server-sized stall step.
        .executableTarget(
            name: "stall-server-probe",
            dependencies: [
                .product(name: "StallDetection", package: "SafeTimers"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        // ordo-one/benchmark suites: `swift package benchmark`.
        .executableTarget(
            name: "SafeTimersBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "SafeTimers", package: "SafeTimers"),
                .product(name: "SafeTimersTesting", package: "SafeTimers"),
            ],
            path: "Benchmarks/SafeTimersBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
