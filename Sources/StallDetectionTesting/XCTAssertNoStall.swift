import Foundation
import StallDetection
import XCTest

// XCTest's naming (`XCTAssert…`), not Swift's lowerCamelCase.
// swift-format-ignore: AlwaysUseLowerCamelCase
/// Fails the XCTest test when `body` blocks `target` for longer than
/// `threshold`, with the stall's report (how long, the blocked thread's stack,
/// where the time went) as the failure's message; returns what `body` returns.
///
/// ```swift
/// func testLayOut() throws {
///     XCTAssertNoStall(of: .mainQueue, threshold: .milliseconds(100)) {
///         gallery.layOut()
///     }
/// }
/// ```
///
/// An XCTest test runs on the main thread, so with `.mainQueue` (or
/// `.mainRunLoop`) a synchronous `body` that runs longer than `threshold` is a
/// stall of the main thread by itself, and is reported as one, cut short where
/// `body` returned. Stalls are waited for as the Swift Testing trait
/// ``StallCheckTrait`` does, except that the synchronous form cannot wait for
/// the main queue when called on the main thread.
///
/// - Parameters:
///   - target: What to watch (see ``StallDetection/StallDetector/Target``).
///   - threshold: How long the target may be blocked.
///   - heartbeat: How often the target is probed; nil for the default.
///   - body: The code under test.
@discardableResult
public func XCTAssertNoStall<T, Failure: Error>(
    of target: StallDetector.Target, threshold: Duration = .milliseconds(250), heartbeat: Duration? = nil,
    file: StaticString = #filePath, line: UInt = #line, _ body: () throws(Failure) -> T
) throws(Failure) -> T {
    let stallGuard = StallGuard(target: target, threshold: threshold, heartbeat: heartbeat)
    let result: Result<T, Failure>
    do throws(Failure) {
        result = .success(try body())
    } catch {
        result = .failure(error)
    }
    let callerIsTarget: Bool
    switch target {
    case .mainQueue, .mainRunLoop: callerIsTarget = Thread.isMainThread
    default: callerIsTarget = false
    }
    for event in stallGuard.finishSynchronously(callerIsTarget: callerIsTarget) {
        XCTFail(StallGuard.failure(event, threshold: stallGuard.threshold), file: file, line: line)
    }
    return try result.get()
}

// swift-format-ignore: AlwaysUseLowerCamelCase
/// The async form of ``XCTAssertNoStall(of:threshold:heartbeat:file:line:_:)``:
/// `body` may await; the end makes a round trip to the target first, as the
/// trait does.
@discardableResult
public func XCTAssertNoStall<T, Failure: Error>(
    of target: StallDetector.Target, threshold: Duration = .milliseconds(250), heartbeat: Duration? = nil,
    file: StaticString = #filePath, line: UInt = #line, _ body: () async throws(Failure) -> T
) async throws(Failure) -> T {
    let stallGuard = StallGuard(target: target, threshold: threshold, heartbeat: heartbeat)
    let result: Result<T, Failure>
    do throws(Failure) {
        result = .success(try await body())
    } catch {
        result = .failure(error)
    }
    for event in await stallGuard.finish() {
        XCTFail(StallGuard.failure(event, threshold: stallGuard.threshold), file: file, line: line)
    }
    return try result.get()
}
