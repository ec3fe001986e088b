/// The chain of awaits above a running Swift async function: who awaited it,
/// who awaited that one, up to the task's entry.
///
/// An async function is split into partial functions; each `await` of another
/// async function is a tail call, so the thread's stack holds only the partial
/// function running now, called by the runtime's job runner
/// (`swift::runJobInEstablishedExecutorContext`, see ``AsyncJobRunner``). The
/// callers live in heap-allocated async contexts instead: each context's first
/// word is its caller's context (`Parent`), its second the partial function the
/// caller resumes in when this one returns (`ResumeParent`). The root context's
/// parent is null.
///
/// The facts of the ABI this reads, in one place (Swift's `AsyncContext` in
/// `include/swift/ABI/Task.h`, and LLVM's frame lowering for `swiftasync`
/// functions, which stores the function's own context in the slot just below
/// its frame record, for a resumed partial function the context after
/// projection):
/// - the context of a frame whose record is at `fp` is the word at `fp - 8`
///   (x86-64 and arm64 alike);
/// - `Parent` at offset 0, `ResumeParent` at offset 8;
/// - contexts are aligned to 16 bytes.
/// Apple platforms also set bit 60 of the saved frame pointer in such a record;
/// Linux does not, which is why the frame is recognised by its caller, the job
/// runner, here.
///
/// Everything is read through `readWord` (``MemoryBlocks``, which cannot fault):
/// a context freed meanwhile reads as garbage, never as a crash, and garbage
/// stops the chain (an address that is not code, a pointer not aligned) with
/// the reason said.
struct AsyncContextChain: Sendable, Equatable {
    /// Where each awaiting caller resumes, innermost first.
    var resumeAddresses: [UInt]
    /// Why the chain stops before its root, or nil when it reached it.
    var cut: Cut?
    /// The contexts read, innermost first: `contexts[i]` holds
    /// `resumeAddresses[i]` and links to `contexts[i + 1]` (the last to null
    /// when the chain reached its root).
    var contexts: [UInt] = []

    enum Cut: Sendable, Equatable {
        /// A context could not be read (freed, or never one).
        case unreadable(UInt)
        /// A resume address is not code: what was read is no context.
        case notCode(UInt)
        /// A context's parent is not aligned as every context is.
        case misaligned(UInt)
        /// More awaits than ``AsyncContextChain/depthLimit``.
        case depthLimit
        /// The thread left the partial function before the chain was read.
        case movedOn
        /// The async function's frame record lay beyond the stack's copy
        /// (a stack deeper than the sampler copies): there are no copied
        /// words to hold the live stack against.
        case beyondCopy

        /// Why the awaits stop here, for reports.
        var reason: String {
            switch self {
            case .unreadable(let address): "the async context at 0x\(String(address, radix: 16)) could not be read"
            case .notCode(let address):
                "a context's resume address 0x\(String(address, radix: 16)) is not code"
            case .misaligned(let address): "a context's parent 0x\(String(address, radix: 16)) is not aligned"
            case .depthLimit: "more than \(AsyncContextChain.depthLimit) awaits"
            case .movedOn: "the thread had resumed other code before its awaits could be read"
            case .beyondCopy: Self.reason(code: code)
            }
        }

        /// The kind of cut, without its address (a profile's marker frame).
        var code: UInt {
            switch self {
            case .unreadable: 1
            case .notCode: 2
            case .misaligned: 3
            case .depthLimit: 4
            case .movedOn: 5
            case .beyondCopy: 6
            }
        }

        /// Why a chain of the kind `code` stops, without the address
        /// ``reason`` names.
        static func reason(code: UInt) -> String {
            switch code {
            case 1: "an async context could not be read"
            case 2: "a context's resume address is not code"
            case 3: "a context's parent is not aligned"
            case 4: "more than \(AsyncContextChain.depthLimit) awaits"
            case 6: "the async frame lay deeper in the stack than the sampler copies"
            default: "the thread had resumed other code before its awaits could be read"
            }
        }

        /// The name a profile shows where a chain of the kind `code` stops:
        /// one name for every cut of that kind (no address), so that the
        /// samples cut alike add up.
        static func markerName(code: UInt) -> String {
            "<awaiting callers not all shown: \(reason(code: code))>"
        }
    }

    /// The most awaits followed.
    static let depthLimit = 1_024
    /// Where a function's own async context lies below its frame record.
    static let contextOffsetBelowRecord: UInt = 8
    static let parentOffset: UInt = 0
    static let resumeParentOffset: UInt = 8
    static let contextAlignment: UInt = 16

    /// Follows the chain from `context`, the running function's own context.
    static func follow(
        from context: UInt, readWord: (UInt) -> UInt?, isText: (UInt) -> Bool
    ) -> AsyncContextChain {
        var chain = AsyncContextChain(resumeAddresses: [], cut: nil)
        var current = context
        while current != 0 {
            guard chain.resumeAddresses.count < depthLimit else {
                chain.cut = .depthLimit
                break
            }
            guard current % contextAlignment == 0 else {
                chain.cut = .misaligned(current)
                break
            }
            guard let parent = readWord(current &+ parentOffset),
                let resume = readWord(current &+ resumeParentOffset)
            else {
                chain.cut = .unreadable(current)
                break
            }
            // A resume address is a partial function's first instruction: code,
            // and never a return address, so `isText`'s "7 bytes before it" rule
            // is asked of the next byte.
            guard resume > 0, isText(resume &+ 8) || isText(resume) else {
                chain.cut = .notCode(resume)
                break
            }
            chain.resumeAddresses.append(resume)
            chain.contexts.append(current)
            current = parent
        }
        return chain
    }

    /// The chain again from `context`, when it is `remembered`'s: every
    /// context's parent and resume address read afresh at once
    /// (`readPairs`: the two words at each address, one after the other; nil
    /// when any is unreadable) and equal to what was read before. A stalled thread's chain
    /// stays the same from sample to sample; reading it link by link costs a
    /// system call per page of contexts, this one for them all. Nil when
    /// anything differs: the caller follows the chain afresh.
    static func confirming(
        _ remembered: AsyncContextChain, from context: UInt, readPairs: ([UInt]) -> [UInt]?
    ) -> AsyncContextChain? {
        let contexts = remembered.contexts
        guard remembered.cut == nil, contexts.first == context, contexts.count == remembered.resumeAddresses.count,
            let pairs = readPairs(contexts), pairs.count == 2 * contexts.count
        else { return nil }
        for index in contexts.indices {
            let expectedParent = index + 1 < contexts.count ? contexts[index + 1] : 0
            guard pairs[2 * index] == expectedParent, pairs[2 * index + 1] == remembered.resumeAddresses[index] else {
                return nil
            }
        }
        return remembered
    }
}
