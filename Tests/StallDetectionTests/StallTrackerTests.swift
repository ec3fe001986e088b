import Dispatch
import Testing

@testable import StallDetection

/// The detector's rules, in virtual time (milliseconds written as ms × 1e6).
@Suite("StallTracker (virtual time)")
struct StallTrackerTests {
    let ms: Int64 = 1_000_000

    @Test("heartbeat: a stall starts once after the threshold and ends at the answer, start within half a beat")
    func heartbeatStall() {
        var tracker = StallTracker(threshold: 250 * ms, now: 0)
        // Healthy beats every 25 ms.
        for beat in stride(from: Int64(0), to: 200, by: 25) {
            tracker.probeSent(at: beat * ms)
            #expect(tracker.progress(at: beat * ms + 10_000) == nil)
            #expect(tracker.tick(now: beat * ms + 20_000) == nil)
        }
        // A block starts at 190 ms; the probe at 200 ms waits behind it.
        tracker.probeSent(at: 200 * ms)
        var started: [StallTracker.Event] = []
        for now in stride(from: Int64(225), through: 800, by: 25) {
            if let event = tracker.tick(now: now * ms) { started.append(event) }
        }
        #expect(started.count == 1, "reported once, not once per beat")
        guard case .started(let id, let duration)? = started.first else { return }
        #expect(duration >= 250 * ms && duration < 275 * ms)
        // The block ends at 790 ms (600 ms long): the queued probe runs then.
        let ended = tracker.progress(at: 790 * ms)
        guard case .ended(let endedID, let total)? = ended else {
            Issue.record("expected an end")
            return
        }
        #expect(endedID == id)
        #expect(abs(total - 600 * ms) <= 15 * ms, "start known within half a heartbeat")
        #expect(tracker.tick(now: 900 * ms) == nil)
    }

    @Test("an answer past the threshold that no look saw is a missed stall of its whole length, reported once")
    func answerAfterTheThresholdWithoutALook() {
        var tracker = StallTracker(threshold: 250 * ms, now: 0)
        tracker.probeSent(at: 0)
        // No tick ran (the detector's looks were late); the answer comes at 400 ms.
        guard case .missed(let id, let duration)? = tracker.progress(at: 400 * ms) else {
            Issue.record("a 400 ms stall must not be lost")
            return
        }
        #expect(id == 1)
        #expect(duration == 400 * ms)
        #expect(tracker.tick(now: 500 * ms) == nil, "nothing is owed any more")
        // A late answer under the threshold is none (the stall's start is the
        // midpoint of the last answer, 400 ms, and the probe, 500 ms); the next
        // stall gets the next id.
        tracker.probeSent(at: 500 * ms)
        #expect(tracker.progress(at: 650 * ms) == nil)
        tracker.probeSent(at: 700 * ms)
        guard case .missed(let next, _)? = tracker.progress(at: 1_000 * ms) else {
            Issue.record("expected a second missed stall")
            return
        }
        #expect(next == 2)
    }

    @Test("a run loop that goes to sleep past the threshold, with no look, had a missed stall")
    func runLoopIdleAfterTheThreshold() {
        var tracker = StallTracker(threshold: 250 * ms, now: 0)
        _ = tracker.progress(at: 10 * ms, busyAfterwards: true)
        guard case .missed(_, let duration)? = tracker.idle(at: 310 * ms) else {
            Issue.record("expected a missed stall")
            return
        }
        #expect(duration == 300 * ms)
        #expect(tracker.idle(at: 900 * ms) == nil, "asleep, nothing owed")
    }

    @Test("an answer that ends a reported stall is its end, not a missed stall")
    func reportedStallEndsOnce() {
        var tracker = StallTracker(threshold: 250 * ms, now: 0)
        tracker.probeSent(at: 0)
        guard case .started(let id, _)? = tracker.tick(now: 260 * ms) else {
            Issue.record("expected a start")
            return
        }
        #expect(tracker.progress(at: 400 * ms) == .ended(id: id, duration: 400 * ms))
    }

    @Test("run loop: start and end are exact")
    func runLoopStall() {
        var tracker = StallTracker(threshold: 250 * ms, now: 0)
        #expect(tracker.progress(at: 10 * ms, busyAfterwards: true) == nil)
        #expect(tracker.idle(at: 12 * ms) == nil)
        #expect(tracker.progress(at: 100 * ms, busyAfterwards: true) == nil)
        #expect(tracker.tick(now: 349 * ms) == nil)
        #expect(tracker.tick(now: 350 * ms) == .started(id: 1, duration: 250 * ms))
        #expect(tracker.tick(now: 500 * ms) == nil)
        #expect(tracker.idle(at: 700 * ms) == .ended(id: 1, duration: 600 * ms))
    }

    @Test("an idle run loop or an answered probe never stalls")
    func idleNeverStalls() {
        var tracker = StallTracker(threshold: 250 * ms, now: 0)
        _ = tracker.idle(at: 1 * ms)
        #expect(tracker.tick(now: 10_000 * ms) == nil)
        tracker.probeSent(at: 10_000 * ms)
        _ = tracker.progress(at: 10_001 * ms)
        #expect(tracker.tick(now: 20_000 * ms) == nil)
    }

    @Test("ids increase from one stall to the next")
    func ids() {
        var tracker = StallTracker(threshold: 10 * ms, now: 0)
        var ids: [UInt64] = []
        for round in Int64(0)..<3 {
            let base = round * 1_000 * ms
            tracker.probeSent(at: base)
            if case .started(let id, _)? = tracker.tick(now: base + 50 * ms) { ids.append(id) }
            _ = tracker.progress(at: base + 60 * ms)
        }
        #expect(ids == [1, 2, 3])
    }
}

@Suite("Stack handling")
struct StackHandlingTests {
    func frame(_ name: String?, uncertain: Bool = false) -> StackFrame {
        StackFrame(address: 0x1000, function: name, file: nil, line: nil, image: nil, isUncertain: uncertain)
    }

    @Test("a complete chain drops every scanned frame")
    func pruneComplete() {
        let frames = [frame("usleep"), frame("stale", uncertain: true), frame("work"), frame("start_thread")]
        #expect(StackShape.prune(frames).map(\.function) == ["usleep", "work", "start_thread"])
    }

    @Test("a broken chain keeps the scanned frames beyond it, and only those")
    func pruneBroken() {
        let frames = [
            frame("poll"), frame("noise", uncertain: true), frame("__libc_poll"),
            frame("userFunction", uncertain: true),
            frame("caller", uncertain: true),
        ]
        #expect(StackShape.prune(frames).map(\.function) == ["poll", "__libc_poll", "userFunction", "caller"])
    }

    @Test("idle workers are told from busy ones")
    func idleShapes() {
        #expect(StackShape.looksIdle([frame("futex_wait"), frame("_dispatch_worker_thread"), frame("start_thread")]))
        #expect(
            !StackShape.looksIdle([
                frame("usleep"), frame("_dispatch_client_callout"), frame("_dispatch_worker_thread"),
            ]))
        #expect(!StackShape.looksIdle([frame("main")]))
    }

    @Test("a .custom thread runnable in a wait to be woken does not confirm a stall; asleep there, or running, it does")
    func wokenWaiter() {
        func sample(_ names: [String]) -> StallBacktrace {
            StallBacktrace(frames: names.map { frame($0) }, threadID: 7, unavailableReason: nil)
        }
        let parked = sample([
            "__futex_abstimed_wait_common64", "___pthread_cond_wait", "Foundation.NSCondition.wait() -> ()",
            "ThreadLoop.run()", "start_thread",
        ])
        let locking = sample(["__lll_lock_wait", "pthread_mutex_lock", "job()"])
        let spinning = sample(["job()", "start_thread"])
        let deepInJob = sample(["a", "b", "c", "d", "pthread_cond_wait"])
        #expect(SamplingContext.isWokenWaiter(parked, runnable: true))
        #expect(SamplingContext.isWokenWaiter(locking, runnable: true))
        #expect(!SamplingContext.isWokenWaiter(parked, runnable: false), "asleep: a job waiting on a condition")
        #expect(!SamplingContext.isWokenWaiter(spinning, runnable: true), "running its own code")
        #expect(!SamplingContext.isWokenWaiter(deepInJob, runnable: true), "the wait is not the innermost call")
        let loop = StallDetector.Target.custom(name: "loop") { _ in }
        // Runnable: signalled by the sampler, or in state R after the sample.
        #expect(!DetectorMachine.confirms(loop, by: parked, runnable: true), "woken from its wait, not run since")
        #expect(DetectorMachine.confirms(loop, by: parked, runnable: false), "asleep throughout")
        #expect(DetectorMachine.confirms(loop, by: spinning, runnable: true))
        #expect(DetectorMachine.confirms(.queue(DispatchQueue(label: "q")), by: spinning, runnable: true) == false)
    }

    @Test("the compact backtrace encoding uses the shortest sign-extended deltas")
    func compactEncoding() {
        let bytes = CompactBacktrace.encode([0x55a2_ea83_132f, 0x55a2_ea83_2481, 0x55a2_ea83_2402])
        #expect(
            bytes == [
                0x02, 0x15, 0x55, 0xa2, 0xea, 0x83, 0x13, 0x2f, 0x21, 0x11, 0x52, 0x20, 0x81, 0x00,
            ])
    }

    @Test("a report prints the phase, the duration and one frame a line")
    func report() {
        let event = StallEvent(
            id: 7, phase: .ended, duration: .milliseconds(612), threshold: .milliseconds(250), target: "main queue",
            backtrace: StallBacktrace(
                frames: [
                    StackFrame(
                        address: 0xabc, function: "slowFunction()", file: "/src/App.swift", line: 42, image: "App",
                        isUncertain: false)
                ], threadID: 99, unavailableReason: nil),
            samplingTime: .milliseconds(2))
        let text = String(describing: event)
        #expect(text.contains("Stall #7 ended: main queue was blocked for 0.612 s (threshold 0.250 s)"))
        #expect(text.contains("#0 0x000000000abc slowFunction() at /src/App.swift:42 (App)"))
        #expect(String(describing: StallBacktrace.unavailable("thread 5 did not answer")).contains("stack unavailable"))
    }
}
