import Foundation
import Synchronization
import Testing

@testable import StallDetection

#if os(Linux)
import Glibc

@Suite("Process facts from /proc")
struct ProcessFactsTests {
    @Test("a thread's age: a new thread's is under a second and below the main thread's, whatever its name")
    func threadAge() throws {
        let mainThread = try #require(ProcessFacts.age(ofThread: ProcessFacts.mainThreadID))
        // A pthread mutex (ThreadSanitizer sees through it): the loop below reads
        // while the thread writes.
        let seen = Locked<(age: Int64?, byID: Int64?)>((nil, nil))
        let thread = Thread {
            let id = Int32(truncatingIfNeeded: ThreadIDs.current())
            seen.withLock { $0 = (ProcessFacts.age(ofThread: nil), ProcessFacts.age(ofThread: id)) }
        }
        // A name with spaces and parentheses: the fields are counted after the last ')'.
        thread.name = "a) b ) c"
        let started = ContinuousClock.now
        thread.start()
        while seen.withLock({ $0.age == nil }) && ContinuousClock.now < started + .seconds(10) { usleep(1_000) }
        let (age, byID) = seen.withLock { $0 }
        let young = try #require(age)
        #expect(young >= 0 && young < 1_000_000_000, "\(young) ns")
        #expect(byID.map { abs($0 - young) <= 20_000_000 } == true, "\(String(describing: byID)) against \(young)")
        #expect(mainThread >= young, "the main thread (\(mainThread) ns) is older than a new one (\(young) ns)")
        #expect(ProcessFacts.age(ofThread: -1) == nil)
    }

    @Test("a thread's time on a core grows while it runs; its wait for one never goes back")
    func scheduleGrows() throws {
        let before = try #require(ProcessFacts.schedule(ofThread: nil))
        let end = ContinuousClock.now + .milliseconds(20)
        var spins = 0
        while ContinuousClock.now < end { spins &+= 1 }
        let after = try #require(ProcessFacts.schedule(ofThread: nil))
        #expect(spins > 0 && after.ran > before.ran && after.waited >= before.waited, "\(before) then \(after)")
        #expect(ProcessFacts.schedule(ofThread: ProcessFacts.mainThreadID) != nil)
    }
}
#endif
