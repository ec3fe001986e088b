import Dispatch
import StallDetection
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One detector around one test's run: started before the test's code, stopped
/// after it only once the detector cannot lose a stall, and the stalls it
/// reported, each as the text of a test failure.
///
/// The end of a run, in order:
/// 1. (async) a round trip to the target: a block posted now runs after every
///    probe the target already owes (a serial queue runs them in order), so a
///    block that ended as the test ended has been answered; skipped for the
///    main run loop, bounded by twice the threshold plus a second;
/// 2. while the target has owed an answer for the threshold, or a reported
///    stall goes on, or a stall is being sampled: wait (at most ``settleLimit``);
/// 3. wait until the detector's `onEvent` handler has been called with every
///    event so far, then stop the detector (a stall still going on ends there,
///    marked as cut short by the stop, and the handler is called with it before
///    `stop()` returns).
///
/// Events are collected by the handler, which runs on the detector's own queue:
/// a test that saturates the cooperative pool cannot keep them from being read.
/// A test that does not stall waits for one round trip: microseconds.
final class StallGuard: Sendable {
    let detector: StallDetector
    let threshold: Duration
    private let ended = EndedEvents()
    /// How long the end waits for a stall to be sampled or answered.
    static let settleLimit = Duration.seconds(10)

    init(target: StallDetector.Target, threshold: Duration, heartbeat: Duration?) {
        let ended = self.ended
        detector = StallDetector(target: target, threshold: threshold, heartbeat: heartbeat) { event in
            if event.phase == .ended { ended.events.withLock { $0.append(event) } }
        }
        self.threshold = detector.threshold
        detector.start()
    }

    /// Ends the run from async code: the stalls' `.ended` events, in order.
    func finish() async -> [StallEvent] {
        await roundTrip()
        let deadline = ContinuousClock.now + Self.settleLimit
        while !detector.isSettled, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(2))
        }
        return stop()
    }

    /// Ends the run from synchronous code (an XCTest test on the main thread):
    /// no round trip; waits while a stall is being sampled, and while the target
    /// owes an overdue answer unless the caller's thread is the target's
    /// (the main thread for the main queue and run loop).
    func finishSynchronously(callerIsTarget: Bool) -> [StallEvent] {
        let deadline = ContinuousClock.now + Self.settleLimit
        while ContinuousClock.now < deadline, callerIsTarget ? detector.isSampling : !detector.isSettled {
            usleep(2_000)
        }
        return stop()
    }

    private func stop() -> [StallEvent] {
        detector.waitForHandler()
        detector.stop()
        return ended.events.withLock { $0 }
    }

    /// Posts a block to the target and waits until it runs, or until twice the
    /// threshold plus a second have passed (a target the test left blocked).
    private func roundTrip() async {
        let post: (@escaping @Sendable () -> Void) -> Void
        switch detector.target {
        case .mainRunLoop: return
        case .mainQueue: post = { DispatchQueue.main.async(execute: $0) }
        case .queue(let queue): post = { queue.async(execute: $0) }
        case .custom(_, let custom): post = custom
        case .cooperativePool: post = { block in Task.detached(priority: .medium) { block() } }
        }
        let limit = threshold * 2 + .seconds(1)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let once = OnceResume(continuation)
            post { once.resume() }
            DispatchQueue.global().asyncAfter(deadline: .now() + limit.timeInterval) { once.resume() }
        }
    }

    /// The text of a test failure for one stall: its report, and for the
    /// cooperative pool the stack of every thread of the pool it found running its work.
    static func failure(_ event: StallEvent, threshold: Duration) -> String {
        var text = "the code under test stalled \(event.target) beyond \(threshold):\n\(event.description)"
        let others = event.poolBacktraces.filter { $0.threadID != event.backtrace.threadID }
        for backtrace in others {
            text += "\n  another thread of the pool running its work:\n\(backtrace.description)"
        }
        return text
    }
}

/// The `.ended` events the detector's handler was called with.
private final class EndedEvents: Sendable {
    let events = Mutex<[StallEvent]>([])
}

/// Resumes a continuation once, from whichever caller comes first.
private final class OnceResume: Sendable {
    private let continuation: Mutex<CheckedContinuation<Void, Never>?>

    init(_ continuation: CheckedContinuation<Void, Never>) {
        self.continuation = Mutex(continuation)
    }

    func resume() {
        continuation.withLock { $0.take() }?.resume()
    }
}

extension Duration {
    /// Seconds as a `TimeInterval`-like `Double`, for dispatch deadlines.
    fileprivate var timeInterval: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
