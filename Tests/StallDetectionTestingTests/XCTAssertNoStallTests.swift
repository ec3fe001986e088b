import Dispatch
import StallDetectionTesting
import XCTest

/// XCTest cannot expect a failure on Linux, so these check the helpers on code
/// that does not stall; the failing path is `StallGuard.finishSynchronously`,
/// checked in `StallCheckTraitTests`.
final class XCTAssertNoStallTests: XCTestCase {
    func testQuietBodyPassesAndReturnsItsValue() throws {
        let queue = DispatchQueue(label: "xctest.quiet")
        let value = XCTAssertNoStall(of: .queue(queue), threshold: .milliseconds(200)) {
            queue.sync { 42 }
        }
        XCTAssertEqual(value, 42)
    }

    func testAsyncBodyPassesAndRethrows() async {
        struct Expected: Error {}
        let queue = DispatchQueue(label: "xctest.async")
        do {
            try await XCTAssertNoStall(of: .queue(queue), threshold: .milliseconds(200)) { () async throws(Expected) in
                throw Expected()
            }
            XCTFail("the body's error was not rethrown")
        } catch {}
    }
}
