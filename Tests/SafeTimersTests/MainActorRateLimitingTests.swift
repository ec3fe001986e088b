import SafeTimersTesting
import Testing

@testable import SafeTimers

@Suite("Main-actor overloads of Debouncer.call and Throttler.call; leading debounce")
struct MainActorRateLimitingTests {
    @Test("plain closures pick the queue overload; @MainActor closures run on the main actor")
    @MainActor
    func overloads() async {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .seconds(1), scheduler: manual)
        let throttler = Throttler(interval: .seconds(1), scheduler: manual)
        let ran = Counter()
        var onMain = 0
        debouncer.call { ran.increment() }
        throttler.call { ran.increment() }
        manual.advance(by: .seconds(1))
        #expect(ran.count == 2)
        debouncer.call { @MainActor in onMain += 1 }
        throttler.call { @MainActor in onMain += 1 }
        manual.advance(by: .seconds(2))
        // The advance ran on the main thread here, so the main-actor actions ran in it.
        #expect(onMain == 2)
    }

    @Test("leading debounce: the first call of a burst runs at once, the last at the end; a lone call once")
    func leadingDebounce() {
        let manual = ManualTimerScheduler()
        let debouncer = Debouncer(delay: .milliseconds(300), leading: true, scheduler: manual)
        let runs = StateLock<[String]>([])
        func send(_ value: String, at milliseconds: Int) {
            manual.advance(to: .milliseconds(milliseconds))
            debouncer.call { runs.withLock { $0.append("\(value)@\(manual.now.milliseconds)") } }
        }
        send("a", at: 0)
        send("b", at: 100)
        send("c", at: 200)
        send("d", at: 1000)
        manual.advance(to: .milliseconds(3000))
        #expect(runs.withLock { $0 } == ["a@0", "c@500", "d@1000"])
    }
}
