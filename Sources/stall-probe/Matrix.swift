import Dispatch
import Foundation

// The cases of the release matrix test: each blocks its thread for `ms` milliseconds
// in a different way, in functions whose names, order and lines the test checks.
// Lines marked `// matrix:<name>` are where the test expects the frame's line.

/// The blocking cases, by name.
let matrixCases: [String: @Sendable (Int) -> Void] = [
    "mutex": { ms in matrixMutexWait(ms) },
    "pipe": { ms in matrixPipeRead(ms) },
    "semaphore": { ms in matrixSemaphoreWait(ms) },
    "recursion": { ms in matrixRecurse(depth: 600, ms) },
    "busy": { ms in matrixBusy1(ms) },
    "sleep": { ms in matrixSleep(ms) },
    "ccallback": { ms in matrixSortWithCallback(ms) },
    "inlined": { ms in inlinedOuter(ms) },
    "destroy": { ms in matrixDestroy(ms) },
]

/// Runs one case and reports how long it really took.
@inline(never)
func runMatrixCase(_ name: String, _ ms: Int) {
    let start = ContinuousClock.now
    matrixCases[name]!(ms)  // matrix:run
    emit("REAL \(milliseconds(ContinuousClock.now - start))")
}

/// Another thread holds the lock for `ms`.
@inline(never)
func matrixMutexWait(_ ms: Int) {
    let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    pthread_mutex_init(mutex, nil)
    let locked = DispatchSemaphore(value: 0)
    let holder = UnsafeSendable(mutex)
    Thread.detachNewThread {
        pthread_mutex_lock(holder.value)
        locked.signal()
        usleep(UInt32(ms) * 1000)
        pthread_mutex_unlock(holder.value)
    }
    locked.wait()
    pthread_mutex_lock(mutex)  // matrix:mutex
    pthread_mutex_unlock(mutex)
}

/// The writer writes after `ms`.
@inline(never)
func matrixPipeRead(_ ms: Int) {
    var descriptors: [Int32] = [0, 0]
    _ = pipe(&descriptors)
    let writer = descriptors[1]
    Thread.detachNewThread {
        usleep(UInt32(ms) * 1000)
        var byte: UInt8 = 1
        _ = write(writer, &byte, 1)
    }
    var byte: UInt8 = 0
    _ = read(descriptors[0], &byte, 1)  // matrix:pipe
    close(descriptors[0])
    close(descriptors[1])
}

@inline(never)
func matrixSemaphoreWait(_ ms: Int) {
    let semaphore = DispatchSemaphore(value: 0)
    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(ms)) { semaphore.signal() }
    semaphore.wait()  // matrix:semaphore
}

@inline(never)
func matrixRecurse(depth: Int, _ ms: Int) {
    if depth <= 1 {
        matrixSleep(ms)  // matrix:recursion-bottom
        blackHole(depth)  // (no tail call: the bottom frame stays on the stack)
        return
    }
    matrixRecurse(depth: depth - 1, ms)  // matrix:recursion
    blackHole(depth)
}

@inline(never)
func blackHole(_ value: Int) {
    if value == -1 { print(value) }
}

@inline(never)
func matrixBusy1(_ ms: Int) {
    matrixBusy2(ms)  // matrix:busy1
    blackHole(1)
}

@inline(never)
func matrixBusy2(_ ms: Int) {
    matrixBusy3(ms)  // matrix:busy2
    blackHole(2)
}

@inline(never)
func matrixBusy3(_ ms: Int) {
    matrixBusy4(ms)  // matrix:busy3
    blackHole(3)
}

@inline(never)
func matrixBusy4(_ ms: Int) {
    matrixBusy5(ms)  // matrix:busy4
    blackHole(4)
}

@inline(never)
func matrixBusy5(_ ms: Int) {
    let end = ContinuousClock.now + .milliseconds(ms)
    var spins = 0
    while ContinuousClock.now < end { spins &+= 1 }  // matrix:busy5
    blackHole(spins)
}

/// `usleep` until `ms` passed; the return value of each call is checked: a
/// sample must never cut a sleep short.
@inline(never)
func matrixSleep(_ ms: Int) {
    let start = ContinuousClock.now
    let result = usleep(UInt32(ms) * 1000)  // matrix:sleep
    let elapsed = milliseconds(ContinuousClock.now - start)
    emit("SLEEP \(result) \(elapsed)")
}

/// `qsort` (C) calls a Swift comparator, which blocks on its first call.
@inline(never)
func matrixSortWithCallback(_ ms: Int) {
    var values: [Int32] = [3, 1, 2]
    matrixCallbackDelay = ms
    values.withUnsafeMutableBufferPointer { buffer in
        qsort(buffer.baseAddress!, buffer.count, MemoryLayout<Int32>.size, matrixCompare)  // matrix:ccallback-sort
    }
}

nonisolated(unsafe) var matrixCallbackDelay = 0

let matrixCompare: @convention(c) (UnsafeRawPointer?, UnsafeRawPointer?) -> Int32 = { left, right in
    matrixComparator(left, right)
}

@inline(never)
func matrixComparator(_ left: UnsafeRawPointer?, _ right: UnsafeRawPointer?) -> Int32 {
    if matrixCallbackDelay > 0 {
        let delay = matrixCallbackDelay
        matrixCallbackDelay = 0
        matrixSleep(delay)  // matrix:ccallback
    }
    let a = left!.load(as: Int32.self)
    let b = right!.load(as: Int32.self)
    return a < b ? -1 : (a > b ? 1 : 0)
}

/// A value moved to another thread by a test helper that knows it is safe.
///
/// `@unchecked Sendable` invariant: the wrapped pointer is used by one thread at a
/// time, handed over through a semaphore or a lock.
struct UnsafeSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

// Inlined frames: in a release build `inlinedMiddle` and `inlinedInner` are
// inlined into `inlinedOuter`, so one return address stands for three frames.

@inline(never)
func inlinedOuter(_ ms: Int) {
    inlinedMiddle(ms)  // matrix:inlined-outer
    blackHole(10)
}

@inline(__always)
func inlinedMiddle(_ ms: Int) {
    inlinedInner(ms)  // matrix:inlined-middle
    blackHole(11)
}

@inline(__always)
func inlinedInner(_ ms: Int) {
    matrixSleep(ms)  // matrix:inlined-inner
    blackHole(12)
}

/// The load address of this executable (for `llvm-symbolizer` in the tests): the
/// start of its first mapping in `/proc/self/maps`.
func executableBase() -> UInt? {
    guard let maps = try? String(contentsOfFile: "/proc/self/maps", encoding: .utf8) else { return nil }
    let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
    for line in maps.split(separator: "\n") where line.hasSuffix(executable) {
        guard let range = line.split(separator: " ").first, let start = range.split(separator: "-").first else {
            continue
        }
        return UInt(start, radix: 16)
    }
    return nil
}

/// An object whose deinit sleeps `ms`.
final class MatrixSlowToFree {
    let ms: Int
    init(_ ms: Int) { self.ms = ms }
    deinit {
        matrixSleep(ms)  // matrix:deinit
    }
}

/// A value whose destroy blocks: it holds the last reference to a `MatrixSlowToFree`.
struct MatrixSlowBox {
    var object: MatrixSlowToFree
}

/// Discards what `make` returns, in a generic function (kept generic in a release
/// build too): the value's destroy is a call through its value witness table that
/// the compiler added, which the debug information gives line 0, amid the code of
/// the loop's line.
@inline(never)
@_semantics("optimize.sil.specialize.generic.never")
func matrixDiscard<T>(_ make: () -> T) {
    var count = 0
    while count < 1 { _ = make(); count += 1 }  // matrix:destroy
}

@inline(never)
func matrixDestroy(_ ms: Int) {
    matrixDiscard { MatrixSlowBox(object: MatrixSlowToFree(ms)) }  // matrix:destroy-call
}
