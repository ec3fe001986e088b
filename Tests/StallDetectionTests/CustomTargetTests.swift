import CStallCapture
import Dispatch
import Foundation
import Testing

@testable import StallDetection

/// Blocks the calling thread for `ms` milliseconds in a function the reports must
/// name; records the thread's id.
@inline(never)
func customTargetBlocker(_ ms: UInt32, thread: Locked<Int32>) {
    thread.withLock { $0 = stallcapture_current_tid() }
    let end = Monotonic.now() + Int64(ms) * 1_000_000
    while Monotonic.now() < end { usleep(UInt32(max(1, (end - Monotonic.now()) / 1_000))) }
}

/// `.custom(name:post:)`: the intended use on a private serial queue, then every
/// hostile `post` we could think of. Real time, generous bounds (the hostile
/// cases also run under ThreadSanitizer, for their races); each test ends
/// with `stop()` returning and the stream finishing, so a deadlock hangs the test
/// (and a leak shows in the weak reference).
/// Waits on a condition nobody signals for `milliseconds`: a job asleep in
/// `pthread_cond_timedwait`.
@inline(never)
func conditionWaitingJob(milliseconds: Int) {
    let condition = NSCondition()
    let end = Date(timeIntervalSinceNow: Double(milliseconds) / 1_000)
    condition.lock()
    while Date() < end { _ = condition.wait(until: end) }
    condition.unlock()
}

/// Waits (really, up to 20 s) until `condition` holds: a loaded machine may take
/// long to sample a first stall, and `stop()` drops a sample under way.
func waitUntil(_ condition: () -> Bool) async {
    let deadline = Monotonic.now() + 20_000_000_000
    while !condition(), Monotonic.now() < deadline { try? await Task.sleep(for: .milliseconds(10)) }
}

// Nested in the serialized in-process suite: no other in-process detector runs
// meanwhile (the stop witness's thread is counted there).
extension StallDetectorInProcessTests {
    @Suite("StallDetector .custom(name:post:)", .serialized)
    struct CustomTargetTests {
        /// Collects the events of `detector` until the stream ends.
        final class Collector: Sendable {
            let events = Locked<[StallEvent]>([])
            let task: Task<Void, Never>

            init(_ detector: StallDetector) {
                let events = self.events
                task = Task.detached {
                    for await event in detector.events { events.withLock { $0.append(event) } }
                }
            }

            /// Waits (really) until the stream ended; returns every event.
            func finish() async -> [StallEvent] {
                await task.value
                return events.withLock { $0 }
            }

            var snapshot: [StallEvent] { events.withLock { $0 } }
        }

        @Test(
            "a private serial queue behind `post` blocked 400 ms: started naming the function and its thread, ended",
            .disabled(if: underThreadSanitizer, "real-time bounds do not hold under ThreadSanitizer"))
        func privateSerialQueue() async {
            // The blocking job runs right after a probe, in the same block, as a
            // request handler runs on the event-loop thread that ran the last probe.
            // (A plain queue's jobs move between worker threads: see the stall-probe
            // "custom" scenario.)
            let queue = DispatchQueue(label: "test.custom.serial")
            let blockNext = Locked(false)
            let blocked = Locked<Int32>(0)
            let detector = StallDetector(
                target: .custom(name: "private queue") { probe in
                    queue.async {
                        probe()
                        if blockNext.withLock({ value in
                            defer { value = false }
                            return value
                        }) {
                            customTargetBlocker(400, thread: blocked)
                        }
                    }
                },
                threshold: .milliseconds(100), heartbeat: .milliseconds(10))
            let collector = Collector(detector)
            detector.start()
            usleep(100_000)
            blockNext.withLock { $0 = true }
            await waitUntil { Self.blockerStall(in: collector.snapshot) != nil }
            detector.stop()
            let events = await collector.finish()
            // A starved test process (a parallel run on 2 cores) may add short
            // stalls of its own; the blocker's is the one that names it.
            #expect(Self.blockerStall(in: events) != nil, "\(events)")
            guard let (started, ended) = Self.blockerStall(in: events) else { return }
            #expect(started.target == "private queue")
            #expect(started.description.contains("customTargetBlocker"), "\(started)")
            #expect(started.backtrace.threadID == UInt64(UInt32(bitPattern: blocked.withLock { $0 })), "\(started)")
            #expect(started.duration >= .milliseconds(100), "detected after \(started.duration)")
            #expect(ended.duration > .milliseconds(300) && ended.duration < .milliseconds(700), "\(ended.duration)")
        }

        @Test(
            "a loop thread of its own whose job waits 500 ms on a condition: the stall is reported, naming the job",
            .disabled(if: underThreadSanitizer, "real-time bounds do not hold under ThreadSanitizer"))
        func jobWaitingOnACondition() async {
            // The job's stack ends in `pthread_cond_timedwait`, like a parked loop's:
            // asleep there, it is a job, and the first look confirms it.
            let jobs = Locked<[@Sendable () -> Void]>([])
            let wake = DispatchSemaphore(value: 0)
            let loop = Thread {
                while true {
                    wake.wait()
                    guard let job = jobs.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) else { return }
                    job()
                }
            }
            loop.start()
            let detector = StallDetector(
                target: .custom(name: "condition loop") { probe in
                    jobs.withLock { $0.append(probe) }
                    wake.signal()
                },
                threshold: .milliseconds(150), heartbeat: .milliseconds(20))
            let collector = Collector(detector)
            detector.start()
            usleep(100_000)
            jobs.withLock { $0.append { conditionWaitingJob(milliseconds: 500) } }
            wake.signal()
            await waitUntil {
                collector.snapshot.contains { $0.phase == .ended && "\($0)".contains("conditionWaitingJob") }
            }
            detector.stop()
            wake.signal()  // an empty queue ends the loop
            let events = await collector.finish()
            let named = events.filter { $0.phase == .started && "\($0)".contains("conditionWaitingJob") }
            #expect(named.count == 1, "\(events)")
        }

        /// The `.started` event that names `customTargetBlocker` and its `.ended`.
        static func blockerStall(in events: [StallEvent]) -> (StallEvent, StallEvent)? {
            guard
                let started = events.first(where: { $0.phase == .started && "\($0)".contains("customTargetBlocker") }),
                let ended = events.first(where: { $0.phase == .ended && $0.id == started.id })
            else { return nil }
            return (started, ended)
        }

        @Test("a `post` that runs the probe inline, on the detector's thread: never a stall, stop returns")
        func inlinePost() async {
            let posts = Locked(0)
            let detector = StallDetector(
                target: .custom(name: "inline") { probe in
                    posts.withLock { $0 += 1 }
                    probe()
                    probe()  // and again: only the first run counts
                },
                threshold: .milliseconds(250), heartbeat: .milliseconds(5))
            let collector = Collector(detector)
            detector.start()
            usleep(300_000)
            detector.stop()
            #expect(await collector.finish().isEmpty)
            #expect(posts.withLock { $0 } > 10)
        }

        @Test(
            "a `post` that runs each probe twice, later: one answer each, a real stall still reported once",
            .disabled(if: underThreadSanitizer, "real-time bounds do not hold under ThreadSanitizer"))
        func runTwice() async {
            let queue = DispatchQueue(label: "test.custom.twice")
            let detector = StallDetector(
                target: .custom(name: "twice") { probe in
                    queue.async(execute: probe)
                    queue.asyncAfter(deadline: .now() + 0.05, execute: probe)
                },
                threshold: .milliseconds(100), heartbeat: .milliseconds(10))
            let collector = Collector(detector)
            detector.start()
            usleep(100_000)
            let blocked = Locked<Int32>(0)
            queue.sync { customTargetBlocker(300, thread: blocked) }
            await waitUntil { collector.snapshot.contains { $0.phase == .ended } }
            usleep(100_000)
            detector.stop()
            let events = await collector.finish()
            // Each stall reported once: started and ended in pairs, one id each (a
            // starved test process may add short stalls of its own).
            let started = events.filter { $0.phase == .started }.map(\.id)
            #expect(!started.isEmpty && started == events.filter { $0.phase == .ended }.map(\.id), "\(events)")
            #expect(Set(started).count == started.count)
        }

        @Test(
            "a `post` that drops every probe: re-posted each heartbeat, reported as one stall, stop returns",
            .disabled(if: underThreadSanitizer, "the first sample outlasts the test under ThreadSanitizer"))
        func dropEveryProbe() async {
            let posts = Locked(0)
            let detector = StallDetector(
                target: .custom(name: "dropping") { _ in posts.withLock { $0 += 1 } },
                threshold: .milliseconds(50), heartbeat: .milliseconds(10))
            let collector = Collector(detector)
            let began = ContinuousClock.now
            detector.start()
            usleep(400_000)
            await waitUntil { !collector.snapshot.isEmpty }
            detector.stop()
            let elapsed = ContinuousClock.now - began
            let events = await collector.finish()
            // The stop ends the stall it cut short.
            #expect(events.map(\.phase) == [.started, .ended], "\(events)")
            #expect(events.last?.endedByStop == true)
            #expect(events.first?.backtrace.unavailableReason?.contains("no probe has run yet") == true)
            // One post a heartbeat (40 in 400 ms), not a flood; a loaded machine
            // samples the first stall late, so the bound follows the time it ran.
            let count = posts.withLock { $0 }
            let heartbeats = Int(elapsed / .milliseconds(10))
            #expect(count >= 5 && count <= heartbeats * 3 / 2 + 20, "\(count) posts in \(elapsed)")
        }

        @Test(
            "a `post` that keeps every probe: one post, one stall; probes run after stop do nothing, keep nothing alive"
        )
        func keepForever() async {
            let kept = Locked<[@Sendable () -> Void]>([])
            weak var weakDetector: StallDetector?
            do {
                let detector = StallDetector(
                    target: .custom(name: "hoarder") { probe in kept.withLock { $0.append(probe) } },
                    threshold: .milliseconds(50), heartbeat: .milliseconds(10))
                weakDetector = detector
                let collector = Collector(detector)
                detector.start()
                await waitUntil { !collector.snapshot.isEmpty }
                usleep(100_000)
                detector.stop()
                let events = await collector.finish()
                // The stop ends the stall it cut short.
                #expect(events.map(\.phase) == [.started, .ended], "\(events)")
                #expect(events.last?.endedByStop == true)
            }
            #expect(weakDetector == nil)
            #expect(kept.withLock { $0.count } == 1, "one probe outstanding at a time")
            for probe in kept.withLock({ $0 }) { probe() }
            kept.withLock { $0.removeAll() }
        }

        @Test(
            "a `post` that blocks until released: the stall is reported meanwhile, stop does not wait for `post`",
            .disabled(if: underThreadSanitizer, "the first sample outlasts the test under ThreadSanitizer"))
        func blockingPost() async {
            let gate = DispatchSemaphore(value: 0)
            let queue = DispatchQueue(label: "test.custom.blocking")
            let detector = StallDetector(
                target: .custom(name: "blocking post") { probe in
                    gate.wait()
                    queue.async(execute: probe)
                },
                threshold: .milliseconds(50), heartbeat: .milliseconds(10))
            let collector = Collector(detector)
            detector.start()
            await waitUntil { !collector.snapshot.isEmpty }
            #expect(collector.snapshot.map(\.phase) == [.started])
            let stopped = Monotonic.now()
            detector.stop()
            #expect(Monotonic.now() - stopped < 200_000_000, "stop did not wait for `post`")
            gate.signal()
            let events = await collector.finish()
            // The stop ends the stall it cut short.
            #expect(events.map(\.phase) == [.started, .ended], "\(events)")
            #expect(events.last?.endedByStop == true)
        }

        @Test(
            "detectors of one heartbeat started, stopped and released on 8 threads meanwhile: the watched queue's stall is reported once, named, and no other detector blames it",
            .disabled(if: underThreadSanitizer, "real-time bounds do not hold under ThreadSanitizer"))
        func churnBesideAStall() async {
            let watched = DispatchQueue(label: "test.churn.watched")
            let blocked = Locked<Int32>(0)
            let detector = StallDetector(
                target: .queue(watched), threshold: .milliseconds(250), heartbeat: .milliseconds(10))
            let collector = Collector(detector)
            let blamed = Locked<[StallEvent]>([])
            let churning = Locked(true)
            let (created, finished) = (Locked(0), Locked(0))
            detector.start()
            // Plain threads: a churn that blocks in `usleep` must not hold the
            // cooperative pool this test awaits on.
            for worker in 0..<8 {
                Thread {
                    var round = 0
                    while churning.withLock({ $0 }) {
                        round += 1
                        let other = StallDetector(
                            target: .queue(DispatchQueue(label: "test.churn.\(worker).\(round)")),
                            threshold: .milliseconds(250), heartbeat: .milliseconds(10),
                            onEvent: { event in
                                if "\(event)".contains("customTargetBlocker") { blamed.withLock { $0.append(event) } }
                            })
                        other.start()
                        created.withLock { $0 += 1 }
                        usleep(UInt32.random(in: 0..<15_000))
                        // Half are stopped, half only released (deinit stops them).
                        if round.isMultiple(of: 2) { other.stop() }
                    }
                    finished.withLock { $0 += 1 }
                }.start()
            }
            usleep(200_000)
            watched.async { customTargetBlocker(600, thread: blocked) }
            await waitUntil { Self.blockerStall(in: collector.snapshot) != nil }
            churning.withLock { $0 = false }
            await waitUntil { finished.withLock { $0 } == 8 }
            detector.stop()
            let events = await collector.finish()
            let stalls = events.filter { $0.phase == .started && "\($0)".contains("customTargetBlocker") }
            #expect(stalls.count == 1, "\(events)")
            guard let (started, ended) = Self.blockerStall(in: events) else { return }
            // A look that came late (the churn's first answers warm their symbols up
            // and load both cores) reports the stall after it ended, from its
            // profile, saying so: still named, still once.
            let sampledLive = started.backtrace.threadID == UInt64(UInt32(bitPattern: blocked.withLock { $0 }))
            #expect(sampledLive || started.description.contains("late"), "\(started)")
            #expect(ended.duration > .milliseconds(500) && ended.duration < .milliseconds(900), "\(ended.duration)")
            #expect(blamed.withLock { $0 }.isEmpty, "another detector named the watched queue's blocker")
            #expect(created.withLock { $0 } > 50, "churned \(created.withLock { $0 }) detectors")
        }

        @Test("a `post` held up while `stop()` returns: the probe the next beat queued behind it is never posted")
        func noPostAfterStop() async {
            // The post runs its probe inline, so the slot is free and the next
            // beat queues a new hand-over behind the held call; `stop()` returns
            // meanwhile (it never waits for `post`). That queued hand-over must
            // call nothing.
            let holdNext = Locked(false)
            let holding = Locked(false)
            let stopped = Locked(false)
            let late = Locked(0)
            let detector = StallDetector(
                target: .custom(name: "held post") { probe in
                    if stopped.withLock({ $0 }) { late.withLock { $0 += 1 } }
                    probe()
                    if holdNext.withLock({ $0 }) {
                        holdNext.withLock { $0 = false }
                        holding.withLock { $0 = true }
                        usleep(150_000)
                    }
                },
                threshold: .milliseconds(100), heartbeat: .milliseconds(1))
            detector.start()
            usleep(20_000)
            holdNext.withLock { $0 = true }
            await waitUntil { holding.withLock { $0 } }
            usleep(20_000)  // beats go on: the next hand-over is queued by now
            detector.stop()
            stopped.withLock { $0 = true }
            usleep(300_000)  // the held call returns; what was queued runs
            #expect(late.withLock { $0 } == 0, "post called after stop() returned")
        }

        @Test("a `post` that stops the detector from inside: no deadlock, the stream ends")
        func stopInsidePost() async {
            let holder = Locked<StallDetector?>(nil)
            let detector = StallDetector(
                target: .custom(name: "self-stopping") { probe in
                    holder.withLock { $0 }?.stop()
                    probe()
                },
                threshold: .milliseconds(50), heartbeat: .milliseconds(10))
            holder.withLock { $0 = detector }
            let collector = Collector(detector)
            detector.start()
            #expect(await collector.finish().isEmpty)
            holder.withLock { $0 = nil }
        }

        @Test("a loop's job asleep on a condition confirms a stall at the first look")
        func jobAsleepOnAConditionConfirms() throws {
            #if os(Linux)
            let condition = NSCondition()
            let tid = Locked<Int32>(0)
            let released = Locked(false)
            let loop = Thread {
                tid.withLock { $0 = stallcapture_current_tid() }
                condition.lock()
                while !released.withLock({ $0 }) { condition.wait() }
                condition.unlock()
            }
            loop.start()
            while tid.withLock({ $0 }) == 0 || !ThreadState.isAsleep(thread: tid.withLock { $0 }) { usleep(1_000) }
            let context = SamplingContext()
            let search = context.find(
                target: .custom(name: "loop") { _ in }, lastAnswering: tid.withLock { $0 }, queue: nil,
                candidatesOnly: false)
            let sample = context.named(search, awaitsInFull: false).backtrace
            let confirmed = DetectorMachine.confirms(
                .custom(name: "loop") { _ in }, by: sample,
                runnable: ThreadState.letter(thread: tid.withLock { $0 }) == "R")
            condition.lock()
            released.withLock { $0 = true }
            condition.signal()
            condition.unlock()
            _ = try #require(search.found, "\(search)")
            #expect(sample.frames.contains { $0.function?.contains("pthread_cond") == true }, "\(sample)")
            #expect(confirmed, "a job asleep on a condition is a job")
            #endif
        }

        @Test("an idle event-loop thread parked in epoll_wait is recognised as idle")
        func epollWaitIsIdle() throws {
            #if os(Linux)
            let epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
            let wake = eventfd(0, Int32(EFD_CLOEXEC))
            defer {
                close(epoll)
                close(wake)
            }
            var event = epoll_event()
            event.events = EPOLLIN.rawValue
            event.data.fd = wake
            epoll_ctl(epoll, EPOLL_CTL_ADD, wake, &event)
            let tid = Locked<Int32>(0)
            let loop = Thread {
                tid.withLock { $0 = stallcapture_current_tid() }
                var ready = epoll_event()
                _ = epoll_wait(epoll, &ready, 1, -1)
            }
            loop.start()
            while tid.withLock({ $0 }) == 0 || !ThreadState.isInEventWait(thread: tid.withLock { $0 }) {
                usleep(1_000)
            }
            let context = SamplingContext()
            let sample = context.backtrace(of: tid.withLock { $0 })
            let confirmed = DetectorMachine.confirms(
                .custom(name: "loop") { _ in }, by: sample,
                runnable: ThreadState.letter(thread: tid.withLock { $0 }) == "R")
            let idle = SamplingContext.isIdle(sample, thread: tid.withLock { $0 })
            var one: UInt64 = 1
            _ = write(wake, &one, 8)
            #expect(sample.unavailableReason == nil)
            #expect(idle, "\(sample)")
            #expect(!confirmed)
            #endif
        }
    }
}
