import Dispatch
import Foundation
import Testing

@testable import StallDetection

/// `StallDetector.withActivity`: per-thread labels that a detector reads while the
/// thread is blocked.
@Suite("Activities")
struct ActivityTests {
    struct Failure: Error, Equatable { var code: Int }

    /// Runs `body` on a new thread and, while it is inside, reads that thread's
    /// activities from this one.
    func activitiesSeen(
        whileInside body: @escaping @Sendable (_ inside: @Sendable () -> Void) -> Void
    ) -> (
        inside: [String], after: [String]
    ) {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let thread = Locked<UInt64>(0)
        let worker = Thread {
            thread.withLock { $0 = ThreadIDs.current() }
            body {
                entered.signal()
                release.wait()
            }
            finished.signal()
            release.wait()
        }
        worker.start()
        entered.wait()
        let id = thread.withLock { $0 }
        let inside = ActivityRecord.activities(ofThread: id)
        release.signal()
        finished.wait()
        let after = ActivityRecord.activities(ofThread: id)
        release.signal()
        return (inside, after)
    }

    @Test("nested activities are seen from another thread, outermost first, and are gone after the body")
    func nested() {
        let seen = activitiesSeen { inside in
            StallDetector.withActivity("screen: Feed") {
                StallDetector.withActivity("layout") { inside() }
            }
        }
        #expect(seen.inside == ["screen: Feed", "layout"])
        #expect(seen.after == [])
    }

    @Test("a body that throws: the error passes through and the label is gone; a sibling replaces it")
    func throwingBody() {
        let seen = activitiesSeen { inside in
            StallDetector.withActivity("request 1") {
                do {
                    try StallDetector.withActivity("parse") { throw Failure(code: 7) }
                    Issue.record("the error was swallowed")
                } catch let failure as Failure {
                    #expect(failure == Failure(code: 7))
                } catch {
                    Issue.record("unexpected \(error)")
                }
                StallDetector.withActivity("render") { inside() }
            }
        }
        #expect(seen.inside == ["request 1", "render"])
        #expect(seen.after == [])
    }

    @Test("the body's result is returned; a dynamic label is kept as it was")
    func result() {
        let name = String(repeating: "screen ", count: 20) + "\(Int.random(in: 0..<1000))"
        let value = StallDetector.withActivity(name) { 42 }
        #expect(value == 42)
        let seen = activitiesSeen { inside in
            StallDetector.withActivity(name) { inside() }
        }
        #expect(seen.inside == [name])
    }

    @Test("another thread's activities never show: each thread has its own")
    func otherThreads() {
        let otherInside = DispatchSemaphore(value: 0)
        let otherRelease = DispatchSemaphore(value: 0)
        let other = Thread {
            StallDetector.withActivity("background sync") {
                otherInside.signal()
                otherRelease.wait()
            }
        }
        other.start()
        otherInside.wait()
        let seen = activitiesSeen { inside in
            StallDetector.withActivity("main work") { inside() }
        }
        otherRelease.signal()
        #expect(seen.inside == ["main work"])
        // This (test) thread has none either.
        #expect(ActivityRecord.activities(ofThread: ThreadIDs.current()) == [])
    }

    @Test("deeper than 32: the outer 32 labels are kept and the report says how many more")
    func tooDeep() {
        @Sendable func nest(_ depth: Int, _ inside: () -> Void) {
            guard depth < 40 else { return inside() }
            StallDetector.withActivity("level \(depth)") { nest(depth + 1, inside) }
        }
        let seen = activitiesSeen { inside in nest(0, inside) }
        #expect(seen.inside.count == StallDetector.maximumActivityDepth + 1)
        #expect(seen.inside.first == "level 0")
        #expect(seen.inside[31] == "level 31")
        #expect(seen.inside.last == "… 8 more")
    }

    @Test("a thread's record goes when the thread exits")
    func threadExit() {
        let thread = Locked<UInt64>(0)
        let done = DispatchSemaphore(value: 0)
        let worker = Thread {
            thread.withLock { $0 = ThreadIDs.current() }
            StallDetector.withActivity("short-lived") {}
            done.signal()
        }
        worker.start()
        done.wait()
        let id = thread.withLock { $0 }
        // The thread exits right after signalling; its record leaves the registry.
        let deadline = ContinuousClock.now + .seconds(5)
        while ProcessFacts.threadExists(Int32(truncatingIfNeeded: id)) && ContinuousClock.now < deadline {
            usleep(1_000)
        }
        #expect(ActivityRecord.registeredThreads.contains(id) == false)
    }

    @Test("a reader copying labels while their thread changes them 200,000 times sees only whole labels, in order")
    func concurrentReader() {
        let stop = Locked(false)
        let thread = Locked<UInt64>(0)
        let started = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let worker = Thread {
            thread.withLock { $0 = ThreadIDs.current() }
            started.signal()
            for index in 0..<200_000 {
                // Heap strings that differ each time: every push replaces a slot.
                StallDetector.withActivity("outer \(index % 7) " + String(repeating: "x", count: 20)) {
                    StallDetector.withActivity("inner \(index)") {}
                }
            }
            stop.withLock { $0 = true }
            finished.signal()
        }
        worker.start()
        started.wait()
        let id = thread.withLock { $0 }
        var reads = 0
        var bad: [String] = []
        while !stop.withLock({ $0 }) {
            let labels = ActivityRecord.activities(ofThread: id)
            reads += 1
            if labels.count > 2 || (labels.first.map { !$0.hasPrefix("outer ") } ?? false)
                || (labels.count == 2 && !labels[1].hasPrefix("inner "))
            {
                bad.append(labels.joined(separator: " | "))
            }
        }
        finished.wait()
        #expect(reads > 0)
        #expect(bad.isEmpty, "\(bad.prefix(5))")
    }
}

extension StallDetectorIntegrationTests.Profiles {
    @Test("a stall inside nested activities reports them, outermost first; another thread's and a finished one do not")
    func stallReportsActivities() throws {
        let run = try ProbeRun.run(["activities"])
        #expect(run.exitStatus == 0)
        #expect(run.ended.count == 1, "\(run.lines)")
        let activities = run.lines.filter { $0.hasPrefix("ACTIVITIES ") }
        #expect(
            activities == [
                "ACTIVITIES 1 started screen: Settings › load preferences",
                "ACTIVITIES 1 ended screen: Settings › load preferences",
            ], "\(run.lines)")
        #expect(run.started.first?.report.contains("activities: screen: Settings › load preferences") == true)
    }
}
