import Dispatch
import Testing

@testable import StallDetection

/// `StallEventOutlet`: what `stop()` promises about a detector's `onEvent`
/// handler, checked on outlets directly (a detector's `stop()` ends with its
/// outlet's `finish()`).
@Suite("StallEventOutlet")
struct EventOutletTests {
    static func event(_ id: UInt64, _ phase: StallEvent.Phase, target: String = "outlet") -> StallEvent {
        StallEvent(
            id: id, phase: phase, duration: .milliseconds(300), threshold: .milliseconds(100), target: target,
            backtrace: .unavailable("not sampled"), samplingTime: .zero)
    }

    static func outlet(_ handler: (@Sendable (StallEvent) -> Void)?) -> StallEventOutlet {
        let (_, continuation) = AsyncStream.makeStream(of: StallEvent.self)
        return StallEventOutlet(continuation: continuation, handler: handler)
    }

    @Test("finish() called from another detector's handler waits for this one's call in progress")
    func finishFromAnotherHandlerWaits() {
        let bEntered = DispatchSemaphore(value: 0)
        let bRelease = DispatchSemaphore(value: 0)
        let bReturned = Locked(false)
        let b = Self.outlet { _ in
            bEntered.signal()
            bRelease.wait()
            bReturned.withLock { $0 = true }
        }
        let finishing = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let bRunningAfterFinish = Locked(false)
        let a = Self.outlet { _ in
            finishing.signal()
            b.finish()
            let running = !bReturned.withLock { $0 }
            bRunningAfterFinish.withLock { $0 = running }
            finished.signal()
        }
        b.publish(Self.event(1, .started, target: "B"))
        #expect(bEntered.wait(timeout: .now() + 10) == .success)
        a.publish(Self.event(1, .started, target: "A"))
        #expect(finishing.wait(timeout: .now() + 10) == .success)
        // B's handler is blocked: A's call to finish() must not return meanwhile.
        let returnedEarly = finished.wait(timeout: .now() + .milliseconds(300)) == .success
        #expect(!returnedEarly, "B's finish() returned while B's handler was still running")
        bRelease.signal()
        if !returnedEarly { #expect(finished.wait(timeout: .now() + 10) == .success) }
        #expect(!bRunningAfterFinish.withLock { $0 })
        a.finish()
    }

    @Test("finish() drops calls not begun, except an .ended whose .started the handler got, which it makes first")
    func finishKeepsTheEndOfAStallTheHandlerSaw() {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let handled = Locked<[String]>([])
        let outlet = Self.outlet { event in
            if event.id == 1 && event.phase == .started {
                entered.signal()
                release.wait()
            }
            handled.withLock { $0.append("\(event.id) \(event.phase)") }
        }
        outlet.publish(Self.event(1, .started))
        #expect(entered.wait(timeout: .now() + 10) == .success)
        // Handed over while the handler is busy with 1's .started, not begun at finish():
        outlet.publish(Self.event(1, .ended))
        outlet.publish(Self.event(2, .started))
        outlet.publish(Self.event(2, .ended))
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(50)) { release.signal() }
        outlet.finish()
        #expect(handled.withLock { $0 } == ["1 started", "1 ended"])
    }

    @Test("finish() called from the outlet's own handler returns, and the handler is not called again")
    func finishFromOwnHandlerReturns() {
        let calls = Locked(0)
        let returned = DispatchSemaphore(value: 0)
        let box = OutletBox()
        let outlet = Self.outlet { _ in
            calls.withLock { $0 += 1 }
            box.outlet?.finish()
            returned.signal()
        }
        box.outlet = outlet
        outlet.publish(Self.event(1, .started))
        outlet.publish(Self.event(1, .ended))
        #expect(returned.wait(timeout: .now() + 10) == .success)
        outlet.finish()
        #expect(calls.withLock { $0 } == 1)
        box.outlet = nil
    }
}

/// Lets a handler reach the outlet it is the handler of.
private final class OutletBox: @unchecked Sendable {
    // `@unchecked Sendable` invariant: written before the first publish and after
    // the last finish, read only by the handler in between.
    var outlet: StallEventOutlet?
}
