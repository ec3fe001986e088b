import Dispatch
import Foundation
import SafeTimers
import Testing

@testable import StallDetection

#if canImport(Glibc)
import Glibc
#endif

/// The watched queue's job: sleeps until `stop` is set.
@inline(never)
private func profileEndBlocker(_ stop: Locked<Bool>) {
    while !stop.withLock({ $0 }) { usleep(2_000) }
}

/// A stall's profile covers the stall and nothing after it: on a loaded machine
/// the detector's threads may conclude a stall long after the target answered,
/// and samples taken meanwhile show the target after the stall (the main run
/// loop waiting for work, a queue running its next job), not the stall.
@Suite(
    "A profile ends where its stall ended (real time)",
    .disabled(if: underThreadSanitizer, "real-time sampling is not checked under ThreadSanitizer"))
struct ProfileEndTests {
    @Test("sampling stops when the target answers, and later samples are left out, though the session is still open")
    func samplesAfterTheAnswerAreLeftOut() throws {
        let queue = DispatchQueue(label: "profile.end")
        let probe = Locked<ProbeAnswer?>(nil)
        queue.sync { probe.withLock { $0 = .here() } }
        let answer = try #require(probe.withLock { $0 })
        let stop = Locked(false)
        let blocked = DispatchSemaphore(value: 0)
        queue.async {
            blocked.signal()
            profileEndBlocker(stop)
        }
        blocked.wait()
        defer { stop.withLock { $0 = true } }
        let detectorThread = DetectorWorker(name: "ProfileEnd")
        let profiler = StallProfiler(
            worker: detectorThread, scheduler: SystemTimerScheduler.shared, sampling: SamplingContext(),
            target: .queue(queue), fatalReportPath: nil, lateAfter: 50_000_000,
            lastAnswering: { (answer.thread, answer.queue) }, owesAnswer: { true })
        defer { profiler.stop() }
        profiler.begin(now: Monotonic.now())
        // A few samples of the stall (every 5–10 ms; a loaded machine may take
        // seconds).
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline,
            detectorThread.sync({ profiler.snapshot().profile.sampleCount }) < 5
        {
            usleep(10_000)
        }
        // The target answers; the job goes on sleeping, as the next job would,
        // while the session stays open for 200 ms (20 or more intervals).
        let answeredAt = Monotonic.now()
        profiler.targetAnswered(at: answeredAt)
        // A sample under way may still join (a signal unanswered for its whole
        // timeout included); then sampling has stopped.
        usleep(500_000)
        let stopped = profiler.sessionSampleCount
        usleep(200_000)
        #expect(profiler.sessionSampleCount == stopped, "samples still taken after the answer")
        let gathered = try #require(profiler.end())
        let times = gathered.recorder.samples.map(\.time)
        #expect(times.count >= 5, "\(times.count) samples")
        #expect(times.allSatisfy { $0 <= answeredAt }, "\(times.filter { $0 > answeredAt }.count) samples after it")
        let names = detectorThread.sync { profiler.profile(of: gathered).functions.map(\.name) }
        #expect(names.contains { $0.contains("profileEndBlocker") }, "\(names.prefix(8))")
    }

    @Test("an answer that came before .started opened the session ends its profile: no sample from after it")
    func answerBeforeTheSessionOpened() throws {
        let queue = DispatchQueue(label: "profile.end.early")
        let worker = Locked<ProbeAnswer?>(nil)
        let stop = Locked(false)
        let blocked = DispatchSemaphore(value: 0)
        queue.async {
            worker.withLock { $0 = .here() }
            blocked.signal()
            profileEndBlocker(stop)
        }
        blocked.wait()
        defer { stop.withLock { $0 = true } }
        let thread = try #require(worker.withLock { $0 })
        let detectorThread = DetectorWorker(name: "ProfileEndEarly")
        let profiler = StallProfiler(
            worker: detectorThread, scheduler: SystemTimerScheduler.shared, sampling: SamplingContext(),
            target: .queue(queue), fatalReportPath: nil, lateAfter: 50_000_000,
            lastAnswering: { (thread.thread, thread.queue) }, owesAnswer: { true })
        defer { profiler.stop() }
        // The stall started; the target answered (no session was open to see it);
        // then the detector, late, reports the stall it decided on before the
        // answer, and `.started` opens the session.
        let start = Monotonic.now() - 300_000_000
        let answeredAt = Monotonic.now()
        profiler.targetAnswered(at: answeredAt)
        let backtrace = StallBacktrace(frames: [], threadID: UInt64(thread.thread), unavailableReason: nil)
        detectorThread.sync {
            profiler.stallStarted(backtrace: backtrace, activities: [], start: start, seen: nil, at: Monotonic.now())
        }
        // 300 ms: 30 or more intervals of a session's pace, had it sampled.
        usleep(300_000)
        #expect(profiler.sessionSampleCount == 0, "samples taken after the answer")
        let gathered = try #require(profiler.end())
        #expect(gathered.recorder.samples.allSatisfy { $0.time <= answeredAt })
    }
}
