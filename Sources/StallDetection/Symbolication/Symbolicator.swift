import Dispatch
import Synchronization

#if os(Linux)
// The toolchain's `Runtime` module: built for Linux and macOS only, and on macOS
// available from macOS 26 (above this package's floor). Apple platforms use the
// `dladdr` symbolicator in Symbolicator+Apple.swift instead.
import Runtime
#endif

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Turns raw addresses into named frames with the toolchain's `Runtime` module, and
/// remembers every address it named. One symbolicator serves the whole process
/// (``shared``): every detector's stacks are named once, whichever detector saw
/// them first.
///
/// `Runtime.Backtrace` has no public initializer from addresses, but its `Codable`
/// form carries the addresses in the Compact Backtrace Format (a header byte, then
/// one instruction per frame); this builds that form and decodes it. The
/// `ImageMap` (the loaded images) is captured once and again only when an address
/// lies in a file's executable mapping that no known image covers, that is after a
/// `dlopen`; names already found stay cached.
///
/// Two ways to name, at very different prices:
/// - ``functionNames(_:)``: function names from the symbol tables alone (tens of
///   microseconds for an address never seen), what a sample needs to tell a
///   thread running a job from an idle one;
/// - ``symbolicate(_:)``: names, inlined frames, files and lines from the debug
///   information (about 15 ms for each address of a debug build seen for the
///   first time), for reports and profiles, off the sampling path.
///
/// Inlined frames: `symbolicated()` lists the frames inlined at an address
/// *before* the frame they were inlined into (innermost first, as a stack is read),
/// and every one of them carries the captured address it came from; each is given
/// that address and that frame's "uncertain" flag.
///
/// Thread-safe: the caches and the image map are behind `state`'s lock, held for
/// look-ups only; `Runtime` runs outside it, on the process's one
/// ``SymbolicationThread`` (whose image cache persists), so one thread naming
/// new code never holds up another's cached look-ups.
#if os(Linux)
final class Symbolicator: Sendable {
    struct Key: Hashable, Sendable {
        var address: UInt
        var isReturnAddress: Bool
    }

    /// The image map and what is cached per address.
    private struct State: @unchecked Sendable {
        // `@unchecked`: `ImageMap` is not `Sendable`; it is only read (to encode it
        // and to find an address's image) under the lock, and replaced whole.
        var images: ImageMap
        var encodedImages: String
        var code: CodeRanges
        /// Frames (innermost first, inlined ones included) per address.
        var cache: [Key: [StackFrame]] = [:]
        /// The start of the function (not inlined) each cached address lies in,
        /// when the image's symbols tell.
        var starts: [Key: UInt] = [:]
        /// Function names alone per address; "" for none.
        var shortNames: [Key: String] = [:]
        /// Addresses some thread waits to have named in full.
        var waiting: Set<Key> = []
        /// Function names alone per function start (``ElfSymbolTable``), so that
        /// a new address in a known function costs no symbolication.
        var namesByStart: [UInt: String] = [:]
        /// Addresses a symbol table puts in a function that `Runtime` named
        /// nothing for, and how many times (``namingAttempts``).
        var namingFailures: [Key: Int] = [:]
        /// Pages of file-backed text that a map taken again did not place in an
        /// image: never a reason to take it again.
        var unplaceablePages: Set<UInt> = []
        /// How many times the image map was taken again.
        var imageGeneration = 0
        var namingCost: Int64 = 0
    }

    private let state: Locked<State>

    /// The process's symbolicator.
    static let shared = Symbolicator()

    /// The process's image map, shared by every symbolicator and taken (on the
    /// ``SymbolicationThread``, between two calls that name code) before the
    /// first symbolication. A map taken *after* one also lists the
    /// debug-information files `Runtime` has mapped meanwhile
    /// (`/usr/lib/debug/.build-id/…`, with the same build id as their library),
    /// and with it `Runtime` named nothing at all: 0 of 6 libc frames
    /// (`ImageOffsetTests`). Replaced only when a library is loaded later.
    private static let sharedImages = Locked<ImageMap?>(nil)

    private static func processImages(refreshing: Bool) -> ImageMap {
        SymbolicationThread.shared.run {
            sharedImages.withLock { shared in
                if !refreshing, let shared { return shared }
                let captured = ImageMap.capture()
                shared = captured
                return captured
            }
        }.value
    }

    init() {
        let images = Self.processImages(refreshing: false)
        state = Locked(State(images: images, encodedImages: Self.encode(images), code: Self.codeRanges(images)))
    }

    /// The process's executable code as the unwinder reads it: a value, taken
    /// once per unwind.
    var code: CodeRanges { state.withLock { $0.code } }

    /// Whether `address` lies in an executable mapping of a file.
    func isFileBackedText(_ address: UInt) -> Bool { code.isFileBackedText(address) }

    /// Whether `address` lies in the main executable's text.
    func isInExecutable(_ address: UInt) -> Bool { code.isInExecutable(address) }

    /// Whether `address` lies in an executable mapping, with the 7 bytes before it
    /// (where the call instruction would be) in the same mapping.
    func isTextAddress(_ address: UInt) -> Bool { code.isText(address) }

    /// How many times the image map was taken again (a library loaded since):
    /// what is cached by code address elsewhere may be stale then.
    var imageGeneration: Int { state.withLock { $0.imageGeneration } }

    /// CPU nanoseconds spent naming addresses not cached yet, by any thread.
    var namingCost: Int64 { state.withLock { $0.namingCost } }

    /// The number of cached addresses.
    var cachedCount: Int { state.withLock { $0.cache.count } }

    /// The images of the image map: name, path, build id (which `Runtime` reads
    /// from each image's `NT_GNU_BUILD_ID` note) and where each is loaded.
    var loadedImages: [LoadedImage] {
        state.withLock { state in
            state.images.compactMap { image in
                guard let name = image.name, let start = UInt(image.baseAddress), let end = UInt(image.endOfText)
                else { return nil }
                return LoadedImage(name: name, path: image.path, buildID: image.uniqueID, start: start, end: end)
            }
        }
    }

    private static let executablePath: String = {
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard count > 0 else { return "" }
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }()

    /// The start of the function `address` lies in (the interrupted instruction, or
    /// a return address): from the executable's symbol table when it is there (a
    /// binary search), else from a full symbolication (cached); nil when unknown.
    func functionStart(of address: UInt, isReturnAddress: Bool) -> UInt? {
        if let table = ElfSymbolTable.executable, code.isInExecutable(address) {
            return table.function(containing: isReturnAddress ? address &- 1 : address)?.start
        }
        let key = Key(address: address, isReturnAddress: isReturnAddress)
        if state.withLock({ $0.cache[key] == nil }) { resolve([key]) }
        return state.withLock { $0.starts[key] }
    }

    /// Names the symbolication thread's own stack and a function of each library
    /// a stalled thread's stack passes through (the C library, libdispatch, the
    /// Swift runtime and its concurrency library), so that the first real stall
    /// does not pay for loading their symbol tables and debug information.
    /// Once per process.
    func warmUp() {
        guard
            !Self.warmedUp.withLock({ warmed in
                let wasWarmed = warmed
                warmed = true
                return wasWarmed
            })
        else { return }
        let (images, encoded) = state.withLock { ($0.images, $0.encodedImages) }
        let libraries = Self.warmUpFunctions.compactMap { dlsym(UnsafeMutableRawPointer(bitPattern: 0), $0) }
        _ = SymbolicationThread.shared.run {
            if let here = try? Backtrace.capture(limit: 16) {
                _ = here.symbolicated(with: images)
            }
            let addresses = libraries.map { UInt(bitPattern: $0) &+ 1 }
            _ = Self.decodeBacktrace(addresses, images: encoded)?.symbolicated(with: images)
        }
        _ = ElfSymbolTable.executable
        _ = ElfSymbolTable.vdso
    }

    /// One exported function of each library the warm-up reads.
    private static let warmUpFunctions = ["pthread_cond_wait", "dispatch_async", "swift_retain", "swift_task_create"]

    private static let warmedUp = Locked(false)

    /// Names the frames; unknown ones keep only their address. The first frame is
    /// the interrupted instruction, the others return addresses (but awaiting
    /// callers' resume points).
    ///
    /// With `awaitsInFull` false, an awaiting caller not named in full yet is
    /// named from its symbol table alone (no file or line): a first stall's
    /// `.started` in a debug build would otherwise wait for the debug
    /// information of every module the awaits pass through (1.6 s for a
    /// Hummingbird route's 25 awaiting frames); `.ended` names them in full.
    func symbolicate(_ raw: [RawFrame], awaitsInFull: Bool = true) -> [StackFrame] {
        guard !raw.isEmpty else { return [] }
        let keys = raw.enumerated().map {
            Key(address: $0.element.address, isReturnAddress: $0.element.isReturnAddress(at: $0.offset))
        }
        let awaits = Set(zip(raw, keys).filter { $0.0.isAwaitResume }.map(\.1))
        let (missing, quick) = state.withLock { state in
            var seen = Set<Key>()
            let missing = zip(raw, keys).filter { frame, key in
                !frame.isAwaitsCut && state.cache[key] == nil && seen.insert(key).inserted
            }.map(\.1)
            return awaitsInFull
                ? (missing, []) : (missing.filter { !awaits.contains($0) }, missing.filter(awaits.contains))
        }
        if !missing.isEmpty { resolve(missing) }
        let shortNames = Dictionary(zip(quick, functionNames(quick)), uniquingKeysWith: { first, _ in first })
        return state.withLock { state in
            var frames: [StackFrame] = []
            frames.reserveCapacity(raw.count)
            for (frame, key) in zip(raw, keys) {
                if frame.isAwaitsCut {
                    frames.append(Self.awaitsCutFrame(code: frame.address))
                    continue
                }
                let short = shortNames[key].flatMap { $0 }.map {
                    [
                        StackFrame(
                            address: key.address, function: Self.readableName($0, file: nil), file: nil, line: nil,
                            image: nil, isUncertain: false)
                    ]
                }
                for named in state.cache[key] ?? short ?? [Self.unnamedFrame(frame.address, state)] {
                    frames.append(named.with(isUncertain: frame.isUncertain, isAwaitResume: frame.isAwaitResume))
                }
            }
            return frames
        }
    }

    /// The frame a profile shows where a sample's awaiting callers stop
    /// before the task's entry (``RawFrame/isAwaitsCut``, the cut's kind in
    /// `code`): no code, so no address, file or image.
    static func awaitsCutFrame(code: UInt) -> StackFrame {
        StackFrame(
            address: 0, function: AsyncContextChain.Cut.markerName(code: code), file: nil, line: nil, image: nil,
            isUncertain: false)
    }

    /// Where ``warmUp()`` and ``prefetch(_:)`` run, for every detector of the
    /// process: a thread of its own (`StallSymbolsPre`), started with work and
    /// ended after 2 s without any. Not a dispatch worker: a program whose
    /// queues hold every dispatch worker would never run them, and its stalls'
    /// names would be read only when a report needs them.
    private static let namingAhead = DetectorWorker(name: "StallSymbolsPre")

    /// Whether a prefetch is waiting on ``namingAhead`` and has not begun: a
    /// later one is dropped meanwhile (a long stall asks again at every sample
    /// while its names are not cached yet; at most one waits).
    private let prefetchWaiting = Atomic<Bool>(false)

    /// Starts ``warmUp()`` on the process's naming-ahead thread and returns at
    /// once: loading symbols takes hundreds of milliseconds of CPU in a debug
    /// build, and neither the target's thread nor the detector's may wait for
    /// it.
    func warmUpAhead() {
        Self.namingAhead.async { [self] in DetectorThreads.work { warmUp() } }
    }

    /// Names `raw`'s addresses not named yet, in full, on the process's
    /// naming-ahead thread (then the symbolication thread), and returns at once: a stall's
    /// first samples are named while it lasts, before its `.started` report needs
    /// the same functions, so that the report is not held up by reading debug
    /// information for the first time. Unique addresses only; nothing is done
    /// when every address is cached. Awaiting callers are left out: `.started`
    /// names them from their symbols (``symbolicate(_:awaitsInFull:)``), and
    /// reading their modules' debug information here would hold up the
    /// symbolication thread the report needs (0.6 s more for a Hummingbird
    /// route's first stall, debug build).
    func prefetch(_ frames: [RawFrame]) {
        let raw = frames.filter { !$0.isAwaitResume && !$0.isAwaitsCut }
        let keys = raw.enumerated().map {
            Key(address: $0.element.address, isReturnAddress: $0.element.isReturnAddress(at: $0.offset))
        }
        guard state.withLock({ state in keys.contains { state.cache[$0] == nil } }) else { return }
        guard !prefetchWaiting.exchange(true, ordering: .acquiringAndReleasing) else { return }
        // A detector's work: a search for a blocked thread never takes this
        // thread (its stack may hold a watched queue's address).
        Self.namingAhead.async { [self] in
            prefetchWaiting.store(false, ordering: .releasing)
            DetectorThreads.work { _ = symbolicate(raw) }
        }
    }

    /// The names of the functions at `keys`, without inlined frames or source
    /// locations: what a sample needs to tell a thread running a job from an
    /// idle one. A symbol-table look-up, with no debug information read, so it
    /// stays cheap for code never seen before; cached per address. The vDSO's
    /// functions are named from its own table.
    func functionNames(_ keys: [Key]) -> [String?] {
        let missing = state.withLock { state in
            var seen = Set<Key>()
            return keys.filter { state.shortNames[$0] == nil && seen.insert($0).inserted }
        }
        if !missing.isEmpty { resolveNames(missing) }
        return state.withLock { state in
            keys.map { key in state.shortNames[key].flatMap { $0.isEmpty ? nil : $0 } }
        }
    }

    /// Names `keys` with the symbol tables alone (`""`: no name): by the
    /// function each lies in where that function was named before, else by
    /// `Runtime` (one call for all of them).
    private func resolveNames(_ keys: [Key]) {
        let before = StallProfiler.threadCPU()
        let starts = keys.map { ElfSymbolTable.function(at: $0.lookupAddress)?.start }
        let unknown = state.withLock { state in
            zip(keys, starts).filter { key, start in
                guard let start, let name = state.namesByStart[start] else { return true }
                state.shortNames[key] = name
                return false
            }.map(\.0)
        }
        var found: [UInt: String] = [:]
        var runtimeCost: Int64 = 0
        if !unknown.isEmpty {
            let (images, encoded) = state.withLock { ($0.images, $0.encodedImages) }
            let failing = namingFailsForTesting.withLock { count in
                defer { count = max(0, count - 1) }
                return count > 0
            }
            let (symbolicated, cpu) = SymbolicationThread.shared.run {
                failing
                    ? nil
                    : Self.decodeBacktrace(unknown.map(\.lookupAddress), images: encoded).flatMap {
                        $0.symbolicated(with: images, options: [.useSymbolCache])
                    }
            }
            runtimeCost = cpu
            for frame in symbolicated?.frames ?? [] where !frame.inlined {
                if let original = UInt(frame.captured.originalProgramCounter), let symbol = frame.symbol {
                    found[original] = Self.readableFunction(symbol.name, offset: symbol.offset, at: original)
                }
            }
        }
        let cost = StallProfiler.threadCPU() - before + runtimeCost
        state.withLock { state in
            for (key, start) in zip(keys, starts) where state.shortNames[key] == nil {
                let name =
                    found[key.lookupAddress] ?? ElfSymbolTable.vdso?.function(containing: key.address)?.name ?? ""
                if name.isEmpty && start != nil && Self.triesAgain(key, &state) { continue }
                state.shortNames[key] = name
                if let start, !name.isEmpty { state.namesByStart[start] = name }
            }
            state.namingCost += cost
        }
    }

    /// How many times an address a symbol table puts in a function is given to
    /// `Runtime` before its lack of a name is kept: a naming that failed once (a
    /// fresh process's first stall, beside busy processes, once had every frame
    /// unnamed) does not leave the address unnamed, and its frames unjudged, for
    /// the process's life.
    static let namingAttempts = 3

    /// Runtime namings of this symbolicator that fail, for tests: each of the
    /// next `n` calls names nothing.
    let namingFailsForTesting = Locked(0)

    /// Whether `key`, which a symbol table puts in a function but `Runtime` did
    /// not name, is left uncached to be named again (counting the failure).
    private static func triesAgain(_ key: Key, _ state: inout State) -> Bool {
        let failures = state.namingFailures[key, default: 0] + 1
        guard failures < namingAttempts else {
            state.namingFailures[key] = nil
            return false
        }
        if state.namingFailures.count > 10_000 { state.namingFailures.removeAll() }
        state.namingFailures[key] = failures
        return true
    }

    /// Symbolicates `keys` and fills the cache, one entry per key.
    ///
    /// Every address is handed to `Runtime` as an instruction address: a return
    /// address as the address before it (inside the call instruction, the line of
    /// the call), exactly the adjustment `Runtime` would make, so that each frame is
    /// found by the address it was asked for. A key the batch leaves unnamed is
    /// tried once more on its own; one that stays unnamed is cached only when it
    /// lies outside every image.
    private func resolve(_ keys: [Key], retrying: Bool = true) {
        let before = StallProfiler.threadCPU()
        refreshImagesIfNeeded(for: keys)
        state.withLock { $0.waiting.formUnion(keys) }
        let runtimeCost = SymbolicationThread.shared.run { [state] in
            // Every address waiting for a name, this thread's and any other's,
            // in one call: threads naming at the same moment (a detector per
            // queue) pay once.
            let (batch, images, encoded) = state.withLock { state in
                let waiting = state.waiting
                state.waiting.removeAll()
                return (waiting.filter { state.cache[$0] == nil }, state.images, state.encodedImages)
            }
            guard !batch.isEmpty else { return }
            let batchKeys = Array(batch)
            let symbolicated = Self.decodeBacktrace(batchKeys.map(\.lookupAddress), images: encoded)?
                .symbolicated(with: images)
            // PLT stubs are named outside the lock: `dladdr` takes the dynamic
            // loader's lock, which a `dlopen` in progress holds.
            var plt: [UInt: String] = [:]
            for frame in symbolicated?.frames ?? [] where !frame.inlined {
                guard let original = UInt(frame.captured.originalProgramCounter), let symbol = frame.symbol else {
                    continue
                }
                let name = Self.readableFunction(symbol.name, offset: symbol.offset, at: original)
                if name != symbol.name { plt[original] = name }
            }
            state.withLock { _ = Self.store(symbolicated, for: batchKeys, plt: plt, in: &$0) }
        }.cpu
        let named = state.withLock { state in
            state.namingCost += StallProfiler.threadCPU() - before + runtimeCost
            return Set(keys.filter { state.cache[$0] != nil })
        }
        let unnamed = keys.filter { !named.contains($0) }
        if retrying && keys.count > 1 {
            for key in unnamed { resolve([key], retrying: false) }
        } else {
            state.withLock { state in
                for key in unnamed where state.cache[key] == nil {
                    if let vdso = Self.vdsoFrame(key.address) {
                        state.cache[key] = [vdso]
                    } else if state.images.indexOfImage(at: Backtrace.Address(UInt64(key.address))) == nil {
                        state.cache[key] = [StackFrame(address: key.address, isUncertain: false)]
                    }
                }
            }
        }
    }

    /// A demangled name as a person reads it: a closure in top-level code
    /// demangles to "closure #8 in " (its context has no name), named here
    /// after its file, "closure #8 in top-level code (main.swift)". Code the
    /// compiler shares between functions with the same body (a release
    /// build's merged function, `rawName` ending in `Tm`) is named after one
    /// of them with "merged " before it, as `swift demangle` names it: the
    /// frame may be any of them (its caller says which was called), and the
    /// short demangled name alone would name one as if it were certain.
    static func readableName(_ name: String, file: String?, rawName: String? = nil) -> String {
        let merged = rawName.map(isMergedFunction) == true ? "merged " : ""
        guard name.hasSuffix(" in ") else { return merged + name }
        let base = file.map { $0.split(separator: "/").last.map(String.init) ?? $0 }
        return merged + name + "top-level code" + (base.map { " (\($0))" } ?? "")
    }

    /// Whether a symbol is a Swift merged function: its mangled name (less a
    /// `.llvm.…`-style suffix) ends in the `Tm` operator.
    static func isMergedFunction(_ rawName: String) -> Bool {
        let symbol = rawName.prefix { $0 != "." }
        let swift = ["$s", "_$s", "$S", "_$S", "$e", "_T0"].contains { symbol.hasPrefix($0) }
        return swift && symbol.hasSuffix("Tm")
    }

    /// Caches the frames `symbolicated` gives for `keys`; returns the keys named.
    private static func store(
        _ symbolicated: SymbolicatedBacktrace?, for keys: [Key], plt: [UInt: String], in state: inout State
    ) -> Set<Key> {
        var named = Set<Key>(keys.filter { state.cache[$0] != nil })
        var group: [StackFrame] = []
        for frame in symbolicated?.frames ?? [] {
            let original = UInt(frame.captured.originalProgramCounter) ?? 0
            let symbol = frame.symbol
            let file = symbol?.sourceLocation.flatMap { $0.line > 0 ? $0.path : nil }
            group.append(
                StackFrame(
                    address: original,
                    function: symbol.map { symbol in
                        plt[original].map { readableName($0, file: file) }
                            ?? readableName(symbol.name, file: file, rawName: symbol.rawName)
                    },
                    file: file,
                    line: symbol?.sourceLocation.flatMap { $0.line > 0 ? $0.line : nil },
                    image: symbol?.imageName,
                    isUncertain: false,
                    isInlined: frame.inlined))
            guard !frame.inlined else { continue }
            // A key's inlined frames, then its own: match the group to the first
            // key with this address that has no name yet (by address, not by
            // position, so that a frame the batch leaves out shifts nothing).
            if let key = keys.first(where: { $0.lookupAddress == original && !named.contains($0) }) {
                named.insert(key)
                let offset = imageOffset(of: key.address, state.images)
                state.cache[key] =
                    symbol == nil && group.count == 1
                    ? vdsoFrame(key.address).map { [$0] } ?? group
                    : group.map { $0.with(address: key.address, imageOffset: offset) }
                if let symbol, symbol.offset >= 0 { state.starts[key] = original &- UInt(symbol.offset) }
            }
            group = []
        }
        return named
    }

    /// A frame of the vDSO, named from its symbol table (no image map lists it).
    private static func vdsoFrame(_ address: UInt) -> StackFrame? {
        guard let table = ElfSymbolTable.vdso, let function = table.function(containing: address) else { return nil }
        return StackFrame(
            address: address, function: function.name, file: nil, line: nil, image: table.imageName,
            isUncertain: false, imageOffset: address &- table.range.lowerBound)
    }

    /// A frame `Runtime` could not name: its image and offset when an image holds
    /// it (not cached, so that a later stall tries again).
    private static func unnamedFrame(_ address: UInt, _ state: State) -> StackFrame {
        guard let index = state.images.indexOfImage(at: Backtrace.Address(UInt64(address))) else {
            return StackFrame(address: address, isUncertain: false)
        }
        return StackFrame(
            address: address, function: nil, file: nil, line: nil, image: state.images[index].name,
            isUncertain: false, imageOffset: imageOffset(of: address, state.images))
    }

    /// `address` relative to the load address of the image it lies in.
    private static func imageOffset(of address: UInt, _ images: ImageMap) -> UInt? {
        guard let index = images.indexOfImage(at: Backtrace.Address(UInt64(address))),
            let base = UInt(images[index].baseAddress)
        else { return nil }
        return address &- base
    }

    /// A new image (a `dlopen` since the map was taken): executable text of a
    /// file the map does not know. (The vDSO is in no image map: taking the map
    /// again for it lost every library's symbols.)
    ///
    /// Not a new image: an address in the rest of the page after an image's
    /// text (`ImageMap` ends an image's text at its last byte, the mapping at
    /// the page's end: a word of a stack equal to that end is no reason to take
    /// the map again), and an address a map taken again did not place before.
    /// Taking the map again empties every cache, so a word that kept doing it
    /// would leave every stack unnamed while the names are read anew.
    private func refreshImagesIfNeeded(for keys: [Key]) {
        let stale = state.withLock { state in
            keys.filter {
                state.code.isFileBackedText($0.address) && !Self.imageCovers($0.address, state.images)
                    && !state.unplaceablePages.contains($0.address / Self.pageSize)
            }
        }
        guard !stale.isEmpty else { return }
        let images = Self.processImages(refreshing: true)
        let encoded = Self.encode(images)
        let code = Self.codeRanges(images)
        state.withLock { state in
            for key in stale where !Self.imageCovers(key.address, images) {
                state.unplaceablePages.insert(key.address / Self.pageSize)
            }
            state.imageGeneration += 1
            (state.images, state.encodedImages, state.code) = (images, encoded, code)
            // A library closed and another loaded at its addresses: nothing named
            // by address before may stand.
            state.cache.removeAll()
            state.starts.removeAll()
            state.shortNames.removeAll()
            state.namesByStart.removeAll()
        }
    }

    private static let pageSize = UInt(sysconf(Int32(_SC_PAGESIZE)))

    /// Whether an image of `images` holds `address`, counting the rest of the
    /// page its text ends in.
    private static func imageCovers(_ address: UInt, _ images: ImageMap) -> Bool {
        if images.indexOfImage(at: Backtrace.Address(UInt64(address))) != nil { return true }
        return images.contains { image in
            guard let base = UInt(image.baseAddress), let end = UInt(image.endOfText) else { return false }
            return address >= base && address < (end + pageSize - 1) / pageSize * pageSize
        }
    }

    private static func codeRanges(_ images: ImageMap) -> CodeRanges {
        CodeRanges(
            text: textRanges(images), fileText: textRanges(images, of: "/"),
            executableText: textRanges(images, of: executablePath))
    }

    /// The executable mappings from `/proc/self/maps`, but not writable ones.
    /// (An image's base to its end of text is not all mapped: reading a hole
    /// between its segments faults.)
    ///
    /// Writable and executable at once is not code here: the toolchain's
    /// `libswiftRuntime.so` (which symbolication links) asks for an executable
    /// stack (`GNU_STACK` RWE), so glibc maps every thread's stack `rwxp`, and as
    /// "text" every pointer into a stack passed for a possible return address (a
    /// JIT's writable code buffer would have no symbols either).
    private static func textRanges(_ images: ImageMap, of path: String? = nil) -> [(start: UInt, end: UInt)] {
        guard let maps = ProcFile.read("/proc/self/maps") else { return [] }
        var ranges: [(start: UInt, end: UInt)] = []
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", maxSplits: 2)
            guard fields.count >= 2, fields[1].count >= 3, fields[1].dropFirst(2).first == "x",
                fields[1].first == "r", fields[1].dropFirst().first != "w"
            else { continue }
            if let path {
                // A whole path, or "/" for any file.
                if path == "/" ? !line.contains(" /") : !line.hasSuffix(" " + path) { continue }
            }
            let bounds = fields[0].split(separator: "-")
            guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16)
            else { continue }
            ranges.append((start, end))
        }
        return ranges.sorted { $0.start < $1.start }
    }

    private static func encode(_ images: ImageMap) -> String {
        guard let data = try? JSONEncoder().encode(images) else { return "null" }
        return String(decoding: data, as: UTF8.self)
    }

    private static func decodeBacktrace(_ addresses: [UInt], images encodedImages: String) -> Backtrace? {
        let frames = addresses.map { (address: $0, isReturnAddress: false) }
        let encoded = Data(CompactBacktrace.encode(frames)).base64EncodedString()
        #if arch(x86_64)
        let architecture = "x86_64"
        #elseif arch(arm64)
        let architecture = "arm64"
        #else
        let architecture = "unknown"
        #endif
        let json = "{\"architecture\":\"\(architecture)\",\"backtrace\":\"\(encoded)\",\"imageMap\":\(encodedImages)}"
        return try? JSONDecoder().decode(Backtrace.self, from: Data(json.utf8))
    }
}

extension Symbolicator.Key {
    /// The address handed to `Runtime`: a return address as the address before
    /// it (inside the call instruction, the line of the call).
    var lookupAddress: UInt { isReturnAddress ? address &- 1 : address }
}

#endif

extension StackFrame {
    init(address: UInt, isUncertain: Bool) {
        self.init(address: address, function: nil, file: nil, line: nil, image: nil, isUncertain: isUncertain)
    }

    func with(address: UInt, imageOffset: UInt?) -> StackFrame {
        StackFrame(
            address: address, function: function, file: file, line: line, image: image, isUncertain: isUncertain,
            isInlined: isInlined, imageOffset: imageOffset, isAwaiting: isAwaiting)
    }

    /// The same frame, uncertain or not, and awaiting (a partial function an
    /// awaiting caller resumes in, ``RawFrame/isAwaitResume``) or not. Frames
    /// the compiler inlined into an awaiting caller's resume function are
    /// awaiting too.
    func with(isUncertain: Bool, isAwaitResume: Bool = false) -> StackFrame {
        StackFrame(
            address: address, function: function, file: file, line: line, image: image, isUncertain: isUncertain,
            isInlined: isInlined, imageOffset: imageOffset, isAwaiting: isAwaitResume)
    }
}
