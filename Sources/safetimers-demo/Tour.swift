import Dispatch
import Foundation
import SafeTimers
import StallDetection

/// Prints a line at once (the tour is watched live).
func say(_ line: String = "") {
    print(line)
    fflush(nil)
}

func header(_ title: String, problem: String) {
    say()
    say("━━ \(title) " + String(repeating: "━", count: max(0, 66 - title.count)))
    say("The problem: \(problem)")
}

/// Blocks the calling thread for real time, as slow code would.
func work(for duration: Duration) {
    let end = ContinuousClock.now + duration
    while ContinuousClock.now < end { usleep(1_000) }
}

/// Waits until `condition` holds (checked every millisecond), at most `limit`.
func wait(upTo limit: Duration = .seconds(5), until condition: () -> Bool) {
    let end = ContinuousClock.now + limit
    while !condition() && ContinuousClock.now < end { usleep(1_000) }
}

/// A value several threads may touch.
final class Shared<Value: Sendable>: @unchecked Sendable {
    // Invariant: `value` is only read and written with `lock` held.
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func get() -> Value { lock.withLock { value } }
    func update<R>(_ body: (inout Value) -> R) -> R { lock.withLock { body(&value) } }
}

// MARK: - Watchdog

func watchdogSection() {
    header(
        "Watchdog",
        problem: "a home-made GCD watchdog needs a DispatchSourceTimer per critical section, and its cancel "
            + "is asynchronous: the 'took too long' handler can still run after the section finished.")
    let reports = Shared<[String]>([])
    func guarded(_ name: String, takes duration: Duration) {
        let started = ContinuousClock.now
        withWatchdog(
            timeout: .milliseconds(200),
            onTimeout: {
                reports.update { $0.append(name) }
                say("  ⚠ watchdog: '\(name)' still running after 200 ms")
            }
        ) {
            work(for: duration)
        }
        say("  '\(name)' finished after \(Int((ContinuousClock.now - started) / .milliseconds(1))) ms")
    }
    guarded("fast sync", takes: .milliseconds(50))
    guarded("slow sync", takes: .milliseconds(450))
    usleep(300_000)
    say("SafeTimers: the watchdog fired for \(reports.get()) only, while the slow section was still running;")
    say("            withWatchdog invalidated it when the section ended, and invalidate() is a barrier.")
}

// MARK: - RepeatingTimer

/// A periodic-jobs registry: several named jobs on one timer, run on every tick.
final class PeriodicJobs: Sendable {
    private let jobs = Shared<[(name: String, run: @Sendable () -> Void)]>([])
    let timer: RepeatingTimer

    init(interval: Duration) {
        let jobs = self.jobs
        timer = RepeatingTimer(interval: interval) {
            for job in jobs.get() { job.run() }
        }
    }

    func register(_ name: String, _ run: @escaping @Sendable () -> Void) {
        jobs.update { $0.append((name, run)) }
    }

    func job(named name: String) -> (@Sendable () -> Void)? {
        jobs.get().first { $0.name == name }?.run
    }

    func remove(named name: String) {
        jobs.update { $0.removeAll { $0.name == name } }
    }

    var names: [String] { jobs.get().map(\.name) }
}

func timerSection() {
    header(
        "RepeatingTimer",
        problem: "DispatchSourceTimer traps on an unbalanced resume() and when released while "
            + "suspended; its cancel() does not stop a handler that is about to run.")
    let ticks = Shared(0)
    let box = Shared<RepeatingTimer?>(nil)
    let timer = RepeatingTimer(interval: .milliseconds(100)) {
        let count = ticks.update { value -> Int in
            value += 1
            return value
        }
        say("  tick \(count)")
        if count == 5, let timer = box.get() {
            timer.cancel()  // from inside the handler: no deadlock, no further tick
            say("  cancelled from inside the handler at tick 5 → \(timer.state)")
        }
    }
    box.update { $0 = timer }
    say("  created → \(timer.state)")
    timer.resume()
    say("  resume() while idle is a no-op, not a trap → \(timer.state)")
    timer.start()
    say("  start() → \(timer.state)")
    usleep(250_000)
    timer.suspend()
    timer.suspend()
    say("  suspend() twice → \(timer.state) (no unbalanced-suspend trap)")
    usleep(250_000)
    timer.resume()
    say("  resume() → \(timer.state)")
    wait { timer.state == .cancelled }
    usleep(150_000)
    say("  after cancel: \(ticks.get()) ticks in total, none after cancel() returned")
    timer.start()
    say("  start() again after cancel → \(timer.state), fireCount reset to \(timer.fireCount)")
    usleep(250_000)
    timer.cancel()
    say("  restarted run ticked \(timer.fireCount) times, then cancel() → \(timer.state)")
    box.update { $0 = nil }

    say()
    say("  A periodic-jobs registry on one timer:")
    let registry = PeriodicJobs(interval: .milliseconds(100))
    let log = Shared<[String]>([])
    for name in ["refresh-feed", "flush-analytics", "prune-cache"] {
        registry.register(name) { log.update { $0.append(name) } }
    }
    registry.timer.start()
    usleep(220_000)
    registry.job(named: "prune-cache")?()
    say("  ran 'prune-cache' by name once more, between ticks")
    registry.remove(named: "flush-analytics")
    say("  removed 'flush-analytics'; registered now: \(registry.names)")
    usleep(220_000)
    registry.timer.cancel()
    let counts = Dictionary(log.get().map { ($0, 1) }, uniquingKeysWith: +)
    say("  runs per job: \(counts.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ", "))")
    say("SafeTimers: every call in every state is defined; cancel() is a barrier; restart is allowed.")
}

// MARK: - DelayedWork

final class ExpensiveCache: Sendable {
    let name: String
    init(name: String) { self.name = name }
    deinit { say("  deinit: ExpensiveCache '\(name)' released") }
}

func delayedWorkSection() {
    header(
        "DelayedWork",
        problem: "a cancelled DispatchWorkItem keeps its closure, and everything the closure "
            + "captured, alive until its deadline passes.")
    let work: DelayedWork = {
        let cache = ExpensiveCache(name: "thumbnails")
        return DelayedWork.schedule(after: .seconds(30)) { say("  refreshed \(cache.name)") }
    }()
    say("  scheduled a refresh in 30 s capturing an ExpensiveCache")
    say("  calling cancel()…")
    let prevented = work.cancel()
    say("  cancel() returned \(prevented): the refresh will never run → state \(work.state)")
    say("SafeTimers: the capture was released before cancel() returned (the deinit line came first).")
}

// MARK: - Owner-bound timers

final class FeedScreen: Sendable {
    let refreshes = Shared(0)
    deinit { say("  deinit: FeedScreen released") }
    func refresh() {
        let count = refreshes.update { value -> Int in
            value += 1
            return value
        }
        say("  FeedScreen refresh #\(count)")
    }
}

func ownerSection() {
    header(
        "Owner-bound timer",
        problem: "Foundation's Timer retains its target, so a screen that owns its polling "
            + "timer never deinitializes, and the timer polls forever.")
    var screen: FeedScreen? = FeedScreen()
    let poll = RepeatingTimer(interval: .milliseconds(100), owner: screen!) { screen in screen.refresh() }
    poll.start()
    usleep(350_000)
    say("  releasing the screen…")
    screen = nil
    wait { poll.state == .cancelled }
    say("  timer state after its owner went away: \(poll.state)")
    say("SafeTimers: the timer held its owner weakly and cancelled itself at its next tick.")
}

// MARK: - Stall detection

@inline(never)
func decodeThumbnails() {
    // Stand-ins for real work done on the main thread by mistake: computing…
    let end = ContinuousClock.now + .milliseconds(700)
    var checksum = 0
    while ContinuousClock.now < end { checksum &+= 1 }
    blackHole(checksum)
}

@inline(never)
func applyFilters() {
    // …and waiting (a lock, a file, a synchronous request).
    usleep(300_000)
    blackHole(1)
}

@inline(never)
func blackHole(_ value: Int) {
    if value == -1 { print(value) }
}

@inline(never)
func deliberatelySlowImageDecode() {
    decodeThumbnails()
    applyFilters()
    blackHole(0)
}

/// Prints a report indented, without the frames of the stack beyond `frames`.
func sayReport(_ event: StallEvent, frames: Int) {
    var shown = 0
    for line in String(describing: event).split(separator: "\n") {
        if line.hasPrefix("  #") {
            shown += 1
            if shown == frames + 1 { say("    …") }
            if shown > frames { continue }
        }
        say("  " + line)
    }
}

func stallSection() {
    header(
        "StallDetector",
        problem: "hang detectors report the threshold, not the real duration, give one stack from the moment the "
            + "threshold passed (blaming whatever ran then), do not say which screen was on, and do not run on Linux.")
    let detector = StallDetector(target: .mainRunLoop, threshold: .milliseconds(250))
    detector.start()
    let ended = Shared<StallEvent?>(nil)
    Task.detached {
        for await event in detector.events {
            sayReport(event, frames: event.phase == .started ? 6 : 0)
            if event.phase == .ended { ended.update { $0 = event } }
        }
    }
    say("  the main thread runs RunLoop.main; on the \"Photo Gallery\" screen, a main-queue block now computes")
    say("  0.7 s in decodeThumbnails() and then waits 0.3 s in applyFilters()…")
    DispatchQueue.main.asyncAfter(deadline: .now() + .milliseconds(200)) {
        StallDetector.withActivity("screen: Photo Gallery") {
            StallDetector.withActivity("scroll") { deliberatelySlowImageDecode() }
        }
    }
    let end = Date().addingTimeInterval(4)
    while ended.get() == nil && Date() < end {
        RunLoop.main.run(until: Date().addingTimeInterval(0.05))
    }
    detector.stop()
    say("SafeTimers: .started named the function with file and line while it was still blocking, and the screen;")
    say("            " + profileNarration(ended.get()?.profile))
    if let event = ended.get(), event.profile.sampleCount > 0 { writeProfileFiles(event) }
}

/// Writes the stall's call tree for profilers: folded stacks (flame graph
/// tools), speedscope's JSON and pprof, in the system's temporary directory.
func writeProfileFiles(_ event: StallEvent) {
    let profile = event.profile
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("safetimers-demo")
    try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    let folded = directory.appendingPathComponent("stall.folded")
    let speedscope = directory.appendingPathComponent("stall.speedscope.json")
    let pprof = directory.appendingPathComponent("stall.pb.gz")
    do {
        try Data(profile.foldedStacks().utf8).write(to: folded)
        try Data(profile.speedscopeJSON(title: "safetimers-demo: Photo Gallery stall").utf8).write(to: speedscope)
        try Data(event.pprof()).write(to: pprof)
    } catch {
        say("            (could not write the call tree to \(directory.path): \(error))")
        return
    }
    say("            The call tree (\(profile.stacks.count) distinct stacks) is in \(folded.path)")
    say("            and \(speedscope.path): open the second at https://www.speedscope.app, or draw")
    say("            a flame graph: swift run stall-flamegraph \(folded.path) > stall.svg")
    say("            As pprof, labelled with the stall and its activities: \(pprof.path); open it with")
    say("            go tool pprof -http=: \(pprof.path), or upload it to Pyroscope or speedscope.")
}

/// What this run's profile showed of the two steps, in its own numbers: never
/// more than it measured.
func profileNarration(_ profile: StallProfile?) -> String {
    guard let profile, profile.sampleCount > 0 else {
        return
            ".ended gave the measured duration; this run took no profile samples, so it cannot say where the time went."
    }
    let samples = { (name: String) in profile.functions.first { $0.name.hasPrefix(name) }?.samples ?? 0 }
    let (decode, filters) = (samples("decodeThumbnails"), samples("applyFilters"))
    let measured =
        ".ended gave the measured duration and \(profile.sampleCount) samples over the stall: "
        + "decodeThumbnails() in \(decode), applyFilters() in \(filters)"
    guard decode + filters >= 10, decode > 0, filters > 0 else {
        return measured + ": too few of each to tell their shares apart."
    }
    let share = Int((Double(decode) / Double(decode + filters) * 100).rounded())
    return measured + " (\(share):\(100 - share); the code ran 70:30)."
}

// MARK: - Fatal stalls

/// The child process of the fatal section: the main thread hangs until it is killed.
func fatalStallChild(path: String) -> Never {
    let detector = StallDetector(target: .mainRunLoop, threshold: .milliseconds(250), fatalReportPath: path)
    detector.start()
    DispatchQueue.main.asyncAfter(deadline: .now() + .milliseconds(200)) {
        StallDetector.withActivity("screen: Checkout") {
            StallDetector.withActivity("apply coupon") { waitForCouponServer() }
        }
    }
    RunLoop.main.run()
    exit(0)
}

@inline(never)
func waitForCouponServer() {
    // A synchronous network call on the main thread, as a stand-in: it never returns.
    while true { _ = usleep(100_000) }
}

func fatalSection() {
    header(
        "Stalls that end in a kill",
        problem: "when a watchdog or the user kills a hung app, the code that hung never reports anything, and "
            + "the next run knows nothing about it.")
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("safetimers-demo-stall.json").path
    unlink(path)
    say("  starting a child process whose main thread hangs in waitForCouponServer() on the Checkout screen;")
    say("  its detector keeps the report of the stall in progress at \(path)…")
    let child = Process()
    child.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    child.arguments = ["--fatal-child", path]
    do {
        try child.run()
    } catch {
        say("  could not start the child: \(error)")
        return
    }
    // The report appears when the stall is detected; kill the child 0.55 s later,
    // about 0.8 s into the stall.
    wait(upTo: .seconds(10)) { access(path, F_OK) == 0 }
    usleep(550_000)
    kill(child.processIdentifier, SIGKILL)
    child.waitUntilExit()
    say("  killed it (SIGKILL), as a watchdog would. The next run calls takeFatalStallReport(at:):")
    if let report = StallDetector.takeFatalStallReport(at: path) {
        sayReport(report, frames: 6)
    } else {
        say("  no report was found")
    }
    say("SafeTimers: the stall the process died in is known on the next run, with its stack, the screen, and")
    say("            where the time went until the kill; reading the report removed it.")
}
