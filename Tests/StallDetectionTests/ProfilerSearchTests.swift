import Dispatch
import Foundation
import SafeTimers
import Testing

@testable import StallDetection

#if canImport(Glibc)
import Glibc
#endif

/// The queue's job is run by a thread that never answered a probe: a
/// `queue.sync` caller. Sleeps until `stop` is set.
@inline(never)
private func profilerSearchSyncBlocker(_ stop: Locked<Bool>) {
    while !stop.withLock({ $0 }) { usleep(2_000) }
}

/// Before `.started`, the profile's samples look for the blocked thread among
/// the likely threads first; when those run nothing of the target they look at
/// every thread, so that a stall no look saw in time (a loaded machine) still has
/// a sample of its job, the evidence a missed stall is reported with (real time).
@Suite(
    "The profile's search for the blocked thread (real time)",
    .disabled(if: underThreadSanitizer, "real-time sampling is not checked under ThreadSanitizer"))
struct ProfilerSearchTests {
    @Test("a queue.sync caller running the watched queue's job is sampled before .started")
    func queueSyncCallerIsSampled() throws {
        // Run on a thread of its own: a test's task runs a Swift job, and its
        // frame would hold the queue's address (a thread read from /proc is judged
        // by its stack's words).
        let result = Locked<[String]?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            result.withLock { $0 = Self.sampledFunctions() }
            done.signal()
        }.start()
        done.wait()
        let names = try #require(result.withLock { $0 })
        #expect(names.contains { $0.contains("profilerSearchSyncBlocker") }, "\(names.prefix(8))")
    }

    /// The functions a profile sampled while a `queue.sync` caller blocked the
    /// queue and the thread of its last probe waited elsewhere. This thread's
    /// stack holds no reference to the watched queue (a thread waiting in the
    /// detector thread's `sync` with the queue's address among its words counts as
    /// running it): the queue lives in ``Stage``.
    private static func sampledFunctions() -> [String] {
        guard let stage = Stage() else { return ["no probe answer"] }
        defer { stage.finish() }
        // Samples come every few milliseconds; a loaded machine may hold the
        // detector's thread back for seconds.
        let deadline = ContinuousClock.now + .seconds(20)
        var names: [String] = []
        while ContinuousClock.now < deadline {
            names = stage.functions()
            if names.contains(where: { $0.contains("profilerSearchSyncBlocker") }) { break }
            usleep(20_000)
        }
        return names
    }

    /// The watched queue blocked by a `queue.sync` caller, the thread of its last
    /// probe waiting elsewhere, and a profile sampling from before `.started`.
    private final class Stage {
        private let stop = Locked(false)
        private let detectorThread = DetectorWorker(name: "ProfilerSearch")
        private var profiler: StallProfiler?

        init?() {
            let queue = DispatchQueue(label: "profiler.search")
            let stop = self.stop
            let answered = Locked<ProbeAnswer?>(nil)
            let probed = DispatchSemaphore(value: 0)
            Thread {
                queue.sync { answered.withLock { $0 = .here() } }
                probed.signal()
                while !stop.withLock({ $0 }) { usleep(5_000) }
            }.start()
            probed.wait()
            guard let answer = answered.withLock({ $0 }), answer.queue != nil else {
                stop.withLock { $0 = true }
                return nil
            }
            let blocked = DispatchSemaphore(value: 0)
            Thread {
                queue.sync {
                    blocked.signal()
                    profilerSearchSyncBlocker(stop)
                }
            }.start()
            blocked.wait()
            let profiler = StallProfiler(
                worker: detectorThread, scheduler: SystemTimerScheduler.shared, sampling: SamplingContext(),
                target: .queue(queue), fatalReportPath: nil, lateAfter: 50_000_000,
                lastAnswering: { (answer.thread, answer.queue) }, owesAnswer: { true })
            profiler.begin(now: Monotonic.now())
            self.profiler = profiler
        }

        /// The functions of the profile so far.
        func functions() -> [String] {
            detectorThread.sync { [self] in profiler?.snapshot().profile.functions.map(\.name) ?? [] }
        }

        func finish() {
            profiler?.stop()
            stop.withLock { $0 = true }
        }
    }
}
