import CStallCapture
import Foundation
import Synchronization
import Testing

@testable import StallDetection

#if os(Linux)
/// Spins in a frame of its own until `spinning` is cleared.
@inline(never)
func stackMappingSpinner(_ spinning: borrowing Atomic<Bool>) {
    while spinning.load(ordering: .relaxed) {}
}

@Suite("A sampled thread's stack mapping, learned once")
struct StackMappingTests {
    @Test("after its first signal sample, a thread's stack is copied without a system call, and says the same")
    func learnedAfterFirstSample() throws {
        let spinning = Atomic<Bool>(true)
        let thread = Atomic<Int32>(0)
        let worker = Thread {
            thread.store(stallcapture_current_tid(), ordering: .releasing)
            stackMappingSpinner(spinning)
        }
        worker.start()
        defer { spinning.store(false, ordering: .relaxed) }
        while thread.load(ordering: .acquiring) == 0 { usleep(1_000) }
        let tid = thread.load(ordering: .acquiring)
        let sampler = StackSampler(timeout: .seconds(2))
        guard case .copied(let first, signalled: true) = sampler.capture(thread: tid) else {
            Issue.record("no signal sample of the spinning thread")
            return
        }
        let pointer = try #require(first.threadPointer)
        #expect(stallcapture_knows_stack(tid, pointer) == 1, "the mapping was learned from the first sample")
        let directBefore = stallcapture_direct_copies(tid)
        guard case .copied(let second, signalled: true) = sampler.capture(thread: tid) else {
            Issue.record("no second signal sample")
            return
        }
        #expect(stallcapture_direct_copies(tid) > directBefore, "the second copy went through the kernel")
        #expect(second.threadPointer == pointer)
        // The direct copy ends at the thread pointer (the stack and its
        // thread-local storage), less than 256 KB above the spinning frame;
        // the kernel's went on to the end of the mapping.
        let directBytes = UInt(second.words.count * MemoryLayout<UInt>.size)
        #expect(second.sp + directBytes == pointer, "\(directBytes) bytes from 0x\(String(second.sp, radix: 16))")
        #expect(second.words.count <= first.words.count)
        // A whole sample, copied directly, unwinds to the spinning frame and
        // its thread's start.
        let backtrace = SamplingContext().backtrace(of: tid)
        let names = backtrace.frames.compactMap(\.function)
        #expect(names.contains { $0.contains("stackMappingSpinner") }, "\(backtrace)")
        #expect(names.contains("start_thread"), "\(backtrace)")
    }

    @Test(
        "a thread on a stack the program allocated (pthread_attr_setstack, inside a larger mapping) is sampled directly and whole"
    )
    func programAllocatedStack() throws {
        // 4 MB mapped; the thread's 1 MB stack in its middle, so that the
        // mapping holding the stack reaches well beyond the thread's control block.
        let size = 4 << 20
        let region = try #require(
            mmap(nil, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), "mmap")
        #expect(region != MAP_FAILED)
        defer { munmap(region, size) }
        let spinning = Atomic<Bool>(true)
        let thread = Atomic<Int32>(0)
        final class Box: @unchecked Sendable {
            // Invariant: both are set before the thread starts and only read after.
            var spinning: UnsafePointer<Atomic<Bool>>?
            var thread: UnsafePointer<Atomic<Int32>>?
        }
        let box = Box()
        withUnsafePointer(to: spinning) { spinningPointer in
            withUnsafePointer(to: thread) { threadPointer in
                box.spinning = spinningPointer
                box.thread = threadPointer
                var attributes = pthread_attr_t()
                pthread_attr_init(&attributes)
                pthread_attr_setstack(&attributes, region + (1 << 20), 1 << 20)
                var handle = pthread_t()
                let created = pthread_create(
                    &handle, &attributes,
                    { context in
                        let box = Unmanaged<Box>.fromOpaque(context!).takeUnretainedValue()
                        box.thread!.pointee.store(stallcapture_current_tid(), ordering: .releasing)
                        stackMappingSpinner(box.spinning!.pointee)
                        return nil
                    }, Unmanaged.passUnretained(box).toOpaque())
                pthread_attr_destroy(&attributes)
                #expect(created == 0)
                while thread.load(ordering: .acquiring) == 0 { usleep(1_000) }
                let tid = thread.load(ordering: .acquiring)
                let directBefore = stallcapture_direct_copies(tid)
                let context = SamplingContext()
                for _ in 0..<3 {
                    let names = context.backtrace(of: tid).frames.compactMap(\.function)
                    #expect(names.contains { $0.contains("stackMappingSpinner") }, "\(names)")
                }
                #expect(stallcapture_direct_copies(tid) - directBefore >= 2, "samples after the first copied directly")
                spinning.store(false, ordering: .relaxed)
                pthread_join(handle, nil)
            }
        }
    }

    @Test("a thread that answered a probe has its stack known before any sample: its first sample is direct")
    func learnedAtTheAnswer() throws {
        let spinning = Atomic<Bool>(true)
        let thread = Atomic<Int32>(0)
        let pointer = Atomic<UInt>(0)
        let worker = Thread {
            ThreadPointers.recordCurrent()  // what a probe's answer does
            pointer.store(UInt(stallcapture_thread_pointer()), ordering: .releasing)
            thread.store(stallcapture_current_tid(), ordering: .releasing)
            stackMappingSpinner(spinning)
        }
        worker.start()
        defer { spinning.store(false, ordering: .relaxed) }
        while thread.load(ordering: .acquiring) == 0 { usleep(1_000) }
        let tid = thread.load(ordering: .acquiring)
        #expect(stallcapture_knows_stack(tid, pointer.load(ordering: .acquiring)) == 1)
        let directBefore = stallcapture_direct_copies(tid)
        let names = SamplingContext().backtrace(of: tid).frames.compactMap(\.function)
        #expect(names.contains { $0.contains("stackMappingSpinner") }, "\(names)")
        #expect(stallcapture_direct_copies(tid) > directBefore, "the first sample went through the kernel")
    }

    @Test("the range taken runs from the mapping holding the stack pointer to the thread pointer, or is the main stack")
    func mappingChoice() {
        let maps = """
            7f0000000000-7f0000001000 ---p 00000000 00:00 0
            7f0000001000-7f0000801000 rw-p 00000000 00:00 0
            7f0000900000-7f0000a00000 rw-p 00000000 00:00 0
            7f0000a00000-7f0000b00000 ---p 00000000 00:00 0
            7ffd00000000-7ffd00100000 rw-p 00000000 00:00 0                          [stack]
            """
        // A glibc thread's stack block: the stack pointer and the TCB in one
        // mapping; the range ends at the thread pointer.
        #expect(
            StackMappings.mapping(in: maps, holding: 0x7f00_0000_5000, threadPointer: 0x7f00_0080_0000)
                == 0x7f00_0000_1000..<0x7f00_0080_0000)
        // A thread pointer below the stack pointer is no stack block's: none.
        #expect(StackMappings.mapping(in: maps, holding: 0x7f00_0000_5000, threadPointer: 0x7f00_0000_2000) == nil)
        // The stack pointer elsewhere than the thread pointer (a coroutine's stack): none.
        #expect(StackMappings.mapping(in: maps, holding: 0x7f00_0090_0000, threadPointer: 0x7f00_0080_0000) == nil)
        // Unreadable (a guard page): none.
        #expect(StackMappings.mapping(in: maps, holding: 0x7f00_00a0_0010, threadPointer: 0x7f00_00a0_0020) == nil)
        // The main thread's stack, whose thread pointer lies elsewhere.
        #expect(
            StackMappings.mapping(in: maps, holding: 0x7ffd_0000_8000, threadPointer: 0x7f00_0080_0000)
                == 0x7ffd_0000_0000..<0x7ffd_0010_0000)
        // An address in no mapping.
        #expect(StackMappings.mapping(in: maps, holding: 0x1000, threadPointer: 0x1000) == nil)
    }
}
#endif
