import Synchronization

/// A primitive's reference to its scheduler's engine, in one word, that counts
/// no reference to the shared scheduler's engine.
///
/// Every primitive keeps its engine alive (releasing a private scheduler never
/// drops what is armed on it), but the shared engine lives as long as the
/// process: counting references to it would write one cache line, shared by
/// every thread, twice per primitive made and released (two threads would then
/// do less work than one). So a private engine is retained here and released in
/// `deinit`; the shared one is neither.
struct EngineReference: ~Copyable, Sendable {
    private let engine: Unmanaged<TimerEngine>

    /// The shared scheduler's engine.
    @inline(__always)
    init() {
        engine = Self.shared
    }

    /// `scheduler`'s engine; the shared one when `scheduler` is nil.
    @inline(__always)
    init(_ scheduler: (any TimerScheduler)?) {
        if let scheduler {
            self.init(scheduler.engine)
        } else {
            self.init()
        }
    }

    /// `engine`, retained unless it is the shared one.
    init(_ engine: TimerEngine) {
        let reference = Unmanaged.passUnretained(engine)
        if reference.toOpaque() != Self.shared.toOpaque() { _ = reference.retain() }
        self.engine = reference
    }

    deinit {
        if engine.toOpaque() != Self.shared.toOpaque() { engine.release() }
    }

    /// The engine (a counted reference for the caller).
    var counted: TimerEngine { engine.takeUnretainedValue() }

    /// Runs `body` with the engine, counting no reference.
    @inline(__always)
    func with<Result>(_ body: (TimerEngine) -> Result) -> Result {
        engine._withUnsafeGuaranteedRef(body)
    }

    /// The shared engine's address (0 until the first look). An `Atomic` global
    /// is initialized statically, so the default path reads it with one load and
    /// counts no reference; a lazy `static let` calls `swift_once` at every read
    /// on Linux, and reading a class reference from it retains the engine.
    private static let sharedAddress = Atomic<UInt>(0)

    @inline(__always)
    static var shared: Unmanaged<TimerEngine> {
        let address = sharedAddress.load(ordering: .acquiring)
        if _fastPath(address != 0) {
            return Unmanaged.fromOpaque(UnsafeRawPointer(bitPattern: address)!)
        }
        let engine = Unmanaged.passUnretained(SystemTimerScheduler.shared.engine)
        sharedAddress.store(UInt(bitPattern: engine.toOpaque()), ordering: .releasing)
        return engine
    }
}

extension TimerEngine {
    /// `scheduler`'s engine; the shared scheduler's when `scheduler` is nil, the
    /// default of every primitive's `scheduler:`.
    @inline(__always)
    static func of(_ scheduler: (any TimerScheduler)?) -> TimerEngine {
        scheduler?.engine ?? EngineReference.shared.takeUnretainedValue()
    }
}
