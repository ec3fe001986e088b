import Foundation
import Testing

@testable import StallDetection

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The calls spelled once per platform, as this platform runs them.
@Suite("Platform spellings")
struct PlatformSpellingTests {
    @Test("the longest threshold is 100 years of 365 days")
    func longestThreshold() {
        #expect(StallDetector.longestThreshold == .seconds(Int64(3_153_600_000)))
    }

    @Test("a file written just now has a modification time of now")
    func modificationTime() throws {
        let path = "/tmp/platform-spelling-\(getpid())"
        #expect(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
        defer { unlink(path) }
        // Through a function of the module: the test module's `stat` and the
        // library's need not be one type (a build saw no member on it).
        let modified = try #require(FileStatus.modificationTime(atPath: path))
        #expect(abs(time(nil) - modified) <= 5)
    }

    @Test("off the main thread, no pass of the main run loop is under way")
    func offTheMainThread() async {
        let inPass = await Task.detached { RunLoopObserverHandle.isInMainRunLoopPass }.value
        #expect(!inPass)
    }

    @Test("sampling is available where there is a sampler; elsewhere every report says why not")
    func samplingSupport() {
        #if os(Linux)
        #expect(SamplingSupport.isAvailable)
        #else
        #expect(!SamplingSupport.isAvailable)
        #endif
        #expect(SamplingSupport.unavailable.unavailableReason == "stack sampling is not supported on this platform")
        #expect(SamplingSupport.unavailable.frames.isEmpty)
    }
}
