#define _GNU_SOURCE
#include "CStallCapture.h"
#include "CStallRawSyscall.h"

#if defined(__linux__)

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

// Requests the handler answers, several at once (one detector per queue or event
// loop samples at the same moments): each slot names the thread it is for (0:
// free or withdrawn, -1: being answered right now) and where its answer goes.
// Only the named thread fills a slot; a thread signalled for two requests (the
// signals merge into one) answers both.
#define STALLCAPTURE_SLOTS 32
typedef struct {
    _Atomic pid_t tid;
    // The thread whose handler is filling this slot right now, 0 otherwise.
    _Atomic pid_t answering;
    _Atomic int taken;
    stallcapture_sample *out;
    sem_t done;
} request_slot;
static request_slot slots[STALLCAPTURE_SLOTS];
// Counts the free slots: a capture waits here when all are taken.
static sem_t slots_free;

static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_result = 0;
static struct sigaction previous_action;

// Each thread's id, read once (a probe's answer asks for it several times, and
// `gettid` is a system call each time); 0 until read. A forked child's one thread
// has a new id: `forget_tid_in_child` clears the copy it inherited. Not for the
// signal handler, which makes the system call (a first access to thread-local
// storage may allocate).
static __thread pid_t cached_tid;
static pthread_once_t tid_fork_once = PTHREAD_ONCE_INIT;
static void forget_tid_in_child(void) { cached_tid = 0; }
static void register_tid_fork_handler(void) { (void)pthread_atfork(NULL, NULL, forget_tid_in_child); }

pid_t stallcapture_current_tid(void) {
    pid_t tid = cached_tid;
    if (tid != 0) return tid;
    pthread_once(&tid_fork_once, register_tid_fork_handler);
    tid = (pid_t)syscall(SYS_gettid);
    cached_tid = tid;
    return tid;
}

// Where libdispatch keeps the queue a thread drains, as an offset from the thread
// pointer (valid for every thread: libdispatch's thread-local record is in the
// static TLS block, at the same offset from each thread's pointer). Found once,
// outside any handler, by `locate_queue_slot`; not found: samples say the queue is
// unknown.
static _Atomic intptr_t queue_slot_offset;
static _Atomic int queue_slot_found;

// Where the Swift concurrency runtime keeps the task a thread runs, as an
// offset from the thread pointer (its thread-local slot is in the static TLS
// block too). Located from Swift, inside tasks, by `SwiftTaskLayout`; until
// then samples say the task is unknown.
static _Atomic intptr_t task_slot_offset;
static _Atomic int task_slot_found;

// Where glibc keeps a thread's kernel id, as an offset from its thread pointer
// (a field of its thread descriptor): a thread pointer remembered for a thread
// id is used only while that field still holds the id (a thread that exited
// leaves its stack, descriptor and TLS to the next thread glibc starts).
static _Atomic intptr_t tid_slot_offset;
static _Atomic int tid_slot_found;

// The calling thread's pointer, read from its register (no call, no TLS lookup).
static inline uintptr_t thread_pointer(void) {
    uintptr_t pointer = 0;
#if defined(__x86_64__)
    __asm__ volatile("mov %%fs:0, %0" : "=r"(pointer));
#elif defined(__aarch64__)
    __asm__ volatile("mrs %0, tpidr_el0" : "=r"(pointer));
#endif
    return pointer;
}

#if defined(__x86_64__)
#include <asm/prctl.h>
#ifndef HWCAP2_FSGSBASE
#define HWCAP2_FSGSBASE (1 << 1)
#endif
// Whether the kernel lets user code read the FS base with `rdfsbase` (Linux 5.9
// and later, on processors that have it); read at install.
static int fs_base_readable;
#endif

// The interrupted thread's pointer, for the signal handler: its register itself,
// never the memory it points to. glibc keeps a pointer to itself at `%fs:0`, but
// a thread whose FS base another runtime set (`arch_prctl`) may point anywhere,
// and a read there faulted inside the handler.
static inline uintptr_t handler_thread_pointer(void) {
    uintptr_t pointer = 0;
#if defined(__x86_64__)
    if (fs_base_readable) {
        __asm__ volatile("rdfsbase %0" : "=r"(pointer));
    } else if (STALLCAPTURE_SYSCALL2(SYS_arch_prctl, ARCH_GET_FS, &pointer) != 0) {
        pointer = 0;
    }
#elif defined(__aarch64__)
    __asm__ volatile("mrs %0, tpidr_el0" : "=r"(pointer));
#endif
    return pointer;
}

// Declared by libdispatch; the Swift overlay does not import them.
extern void *dispatch_get_current_queue(void);
extern void *dispatch_queue_create(const char *label, void *attributes);
extern void dispatch_sync_f(void *queue, void *context, void (*work)(void *));
extern void dispatch_release(void *object);

// Reads `size` bytes at `address` without faulting (0 on success).
static int read_memory(uintptr_t address, void *into, size_t size) {
    struct iovec local = {into, size};
    struct iovec remote = {(void *)address, size};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)size ? 0 : -1;
}

// Run on a queue: finds libdispatch's thread-local record through the pthread key
// libdispatch registers it under (its value is the record's address; the record
// starts with the thread id and then holds the current queue), and stores the
// queue field's offset from the thread pointer in `*(intptr_t *)context`, or
// leaves it at INTPTR_MIN.
static void find_queue_slot(void *context) {
    uintptr_t queue = (uintptr_t)dispatch_get_current_queue();
    pid_t tid = (pid_t)syscall(SYS_gettid);
    uintptr_t pointer = thread_pointer();
    for (pthread_key_t key = 0; key < PTHREAD_KEYS_MAX && pointer != 0; key++) {
        uintptr_t record = (uintptr_t)pthread_getspecific(key);
        // A thread's static TLS lies next to its thread pointer.
        if (record == 0 || record - pointer + (1u << 24) > (1u << 25)) continue;
        struct { pid_t tid; uintptr_t queue; } head;
        if (read_memory(record, &head, sizeof head) != 0 || head.tid != tid || head.queue != queue) continue;
        *(intptr_t *)context = (intptr_t)(record + offsetof(__typeof__(head), queue) - pointer);
        return;
    }
}

static intptr_t queue_slot_on(const char *label) {
    intptr_t offset = INTPTR_MIN;
    void *queue = dispatch_queue_create(label, NULL);
    if (queue == NULL) return offset;
    dispatch_sync_f(queue, &offset, find_queue_slot);
    dispatch_release(queue);
    return offset;
}

static void *queue_slot_on_other_thread(void *result) {
    *(intptr_t *)result = queue_slot_on("SafeTimers.StallDetection.locate-queue-2");
    return NULL;
}

// Finds the queue field's offset on two threads and two queues; keeps it only
// when both agree (a libdispatch whose record is in dynamic TLS, loaded by
// dlopen, has no common offset).
static void locate_queue_slot(void) {
    intptr_t here = queue_slot_on("SafeTimers.StallDetection.locate-queue-1");
    if (here == INTPTR_MIN) return;
    intptr_t there = INTPTR_MIN;
    pthread_t other;
    if (pthread_create(&other, NULL, queue_slot_on_other_thread, &there) != 0) return;
    pthread_join(other, NULL);
    if (there != here) return;
    atomic_store_explicit(&queue_slot_offset, here, memory_order_relaxed);
    atomic_store_explicit(&queue_slot_found, 1, memory_order_release);
}

// The offsets from the calling thread's pointer, within its thread descriptor
// (glibc's `struct pthread`: from the thread pointer up on x86-64, below it on
// arm64), whose 32-bit word holds its kernel id, at most `capacity`. The
// descriptor ends a thread's stack mapping on x86-64: the read stays within
// its first kilobyte (the id is at 0x2d0 in glibc 2.35).
static int tid_offsets(intptr_t *offsets, int capacity) {
    pid_t tid = (pid_t)syscall(SYS_gettid);
    uintptr_t pointer = thread_pointer();
#if defined(__aarch64__)
    int32_t words[512];
    intptr_t first = -(intptr_t)sizeof words;
#else
    int32_t words[256];
    intptr_t first = 0;
#endif
    if (pointer == 0 || read_memory(pointer + (uintptr_t)first, words, sizeof words) != 0) return 0;
    int found = 0;
    for (size_t index = 0; index < sizeof words / sizeof words[0] && found < capacity; index++) {
        if (words[index] == tid) offsets[found++] = first + (intptr_t)(index * sizeof words[0]);
    }
    return found;
}

typedef struct { intptr_t offsets[16]; int count; } tid_candidates;

static void *tid_offsets_on_other_thread(void *result) {
    tid_candidates *candidates = result;
    candidates->count = tid_offsets(candidates->offsets, 16);
    return NULL;
}

// Finds the id's offset on two threads; keeps the first both agree on.
static void locate_tid_slot(void) {
    tid_candidates here = {{0}, 0}, there = {{0}, 0};
    here.count = tid_offsets(here.offsets, 16);
    pthread_t other;
    if (here.count == 0 || pthread_create(&other, NULL, tid_offsets_on_other_thread, &there) != 0) return;
    pthread_join(other, NULL);
    for (int mine = 0; mine < here.count; mine++) {
        for (int theirs = 0; theirs < there.count; theirs++) {
            if (here.offsets[mine] != there.offsets[theirs]) continue;
            atomic_store_explicit(&tid_slot_offset, here.offsets[mine], memory_order_relaxed);
            atomic_store_explicit(&tid_slot_found, 1, memory_order_release);
            return;
        }
    }
}

uintptr_t stallcapture_thread_pointer(void) { return thread_pointer(); }

int stallcapture_queue_of_thread(pid_t tid, uintptr_t pointer, uintptr_t *queue) {
    if (pointer == 0 || !atomic_load_explicit(&queue_slot_found, memory_order_acquire)) return 0;
    // The record starts with the thread id, then the queue (see find_queue_slot).
    struct { pid_t tid; uintptr_t queue; } head;
    uintptr_t slot = pointer + (uintptr_t)atomic_load_explicit(&queue_slot_offset, memory_order_relaxed);
    if (read_memory(slot - offsetof(__typeof__(head), queue), &head, sizeof head) != 0 || head.tid != tid) return 0;
    *queue = head.queue;
    return 1;
}

uintptr_t stallcapture_tls_word(intptr_t offset) {
    uintptr_t word = 0;
    if (read_memory(thread_pointer() + (uintptr_t)offset, &word, sizeof word) != 0) return 0;
    return word;
}

void stallcapture_set_task_slot(intptr_t offset) {
    atomic_store_explicit(&task_slot_offset, offset, memory_order_relaxed);
    atomic_store_explicit(&task_slot_found, 1, memory_order_release);
}

int stallcapture_task_of_thread(pid_t tid, uintptr_t pointer, uintptr_t *task) {
    if (pointer == 0 || !atomic_load_explicit(&task_slot_found, memory_order_acquire)
        || !atomic_load_explicit(&tid_slot_found, memory_order_acquire)) {
        return 0;
    }
    int32_t owner = 0;
    uintptr_t id = pointer + (uintptr_t)atomic_load_explicit(&tid_slot_offset, memory_order_relaxed);
    if (read_memory(id, &owner, sizeof owner) != 0 || owner != tid) return 0;
    uintptr_t slot = pointer + (uintptr_t)atomic_load_explicit(&task_slot_offset, memory_order_relaxed);
    return read_memory(slot, task, sizeof *task) == 0;
}

int stallcapture_is_answering(pid_t tid) {
    for (int index = 0; index < STALLCAPTURE_SLOTS; index++) {
        if (atomic_load(&slots[index].answering) == tid) return 1;
    }
    return 0;
}

// Where the main thread's stack mapping ends (0: not known), read at install:
// its thread pointer is not on its stack.
static uintptr_t main_stack_end;

static void read_main_stack_end(void) {
    int maps = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (maps < 0) return;
    // Line by line (a server's file holds thousands of lines; [stack] is near
    // the end); a line longer than `line` is cut, which leaves its range whole.
    char chunk[4096], line[512];
    size_t used = 0;
    ssize_t count;
    while ((count = read(maps, chunk, sizeof chunk)) > 0) {
        for (ssize_t index = 0; index < count; index++) {
            if (chunk[index] != '\n') {
                if (used < sizeof line - 1) line[used++] = chunk[index];
                continue;
            }
            line[used] = 0;
            used = 0;
            unsigned long start = 0, end = 0;
            if (strstr(line, "[stack]") != NULL && sscanf(line, "%lx-%lx", &start, &end) == 2) {
                main_stack_end = (uintptr_t)end;
                close(maps);
                return;
            }
        }
    }
    close(maps);
}

// Where the stack that holds `sp` ends, as far as the handler can know without
// the memory-map lock (0: not known). A copy that runs past its mapping's end
// faults in the kernel, and a fault on an address in no mapping takes that lock.
// A glibc thread's stack lies below its thread pointer, in the same mapping (the
// descriptor and static TLS end the mapping); the main thread's ends where its
// `[stack]` mapping does.
static uintptr_t stack_end(uintptr_t sp, uintptr_t pointer) {
    if (pointer > sp) return pointer;
    // The main thread's stack may grow to 64 MB below where it ended at install.
    if (main_stack_end > sp && main_stack_end - sp <= ((uintptr_t)64 << 20)) return main_stack_end;
    return 0;
}

// Reads `size` bytes of the interrupted thread's memory in the handler, through
// the pipe `taken` for the sample; 1 when read.
static int handler_read(int taken, uintptr_t address, void *into, size_t size) {
    int error = 0;
    return stallcapture_copy_memory_with(taken, into, address, size, &error) == size;
}

static void fill_registers(stallcapture_sample *out, void *context) {
    ucontext_t *uc = (ucontext_t *)context;
    struct timespec now;
    out->time_ns = clock_gettime(CLOCK_MONOTONIC, &now) == 0
        ? (int64_t)now.tv_sec * 1000000000 + (int64_t)now.tv_nsec : 0;
#if defined(__x86_64__)
    out->pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    out->sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
    out->fp = (uintptr_t)uc->uc_mcontext.gregs[REG_RBP];
#elif defined(__aarch64__)
    out->pc = (uintptr_t)uc->uc_mcontext.pc;
    out->sp = (uintptr_t)uc->uc_mcontext.sp;
    out->fp = (uintptr_t)uc->uc_mcontext.regs[29];
#else
    out->pc = out->sp = out->fp = 0;
#endif
}

// The thread's current queue and task, through the pipe `taken`.
static void fill_thread_words(stallcapture_sample *out, int taken) {
    // The queue is read from libdispatch's thread-local record at the offset
    // found at install: calling into libdispatch here reached its thread-local
    // variable through __tls_get_addr, which after a dlopen or dlclose of a
    // library with thread-local storage updates the thread's TLS vector and
    // frees memory inside the handler (heap corruption when the signal came
    // during malloc or free).
    // Read without faulting (stallcapture_copy_memory_with): a thread whose thread
    // pointer is not glibc's (a runtime that makes its own threads) gets
    // "unknown", not a fault.
    out->thread_pointer = handler_thread_pointer();
    out->queue = 0;
    out->queue_known = 0;
    if (out->thread_pointer != 0 && atomic_load_explicit(&queue_slot_found, memory_order_acquire)) {
        uintptr_t slot = out->thread_pointer + (uintptr_t)atomic_load_explicit(&queue_slot_offset, memory_order_relaxed);
        out->queue_known = handler_read(taken, slot, &out->queue, sizeof out->queue);
        if (!out->queue_known) out->queue = 0;
    }
    // The task, the same way (the runtime's own accessor goes through
    // __tls_get_addr too).
    out->task = 0;
    out->task_known = 0;
    if (out->thread_pointer != 0 && atomic_load_explicit(&task_slot_found, memory_order_acquire)) {
        uintptr_t slot = out->thread_pointer + (uintptr_t)atomic_load_explicit(&task_slot_offset, memory_order_relaxed);
        out->task_known = handler_read(taken, slot, &out->task, sizeof out->task);
        if (!out->task_known) out->task = 0;
    }
}

// The stack from the stack pointer to its end, through the pipe `taken`.
static void fill_stack(stallcapture_sample *out, int taken) {
    // No unwinding here: glibc's backtrace() (libgcc) reads the code at each
    // return address to recognize signal frames, and faulted on a JIT's
    // execute-only or just-unmapped page. The sampler thread unwinds the copy.
    // Copy the stack as far as it is readable (stallcapture_copy_memory_with: never a
    // fault, and no memory-map lock held while this thread waits for a core).
    out->stack_size = 0;
    out->copy_error = 0;
    out->on_alternate_stack = 0;
    stack_t alternate;
    if (STALLCAPTURE_SYSCALL2(SYS_sigaltstack, NULL, &alternate) == 0 && !(alternate.ss_flags & SS_DISABLE) &&
        out->sp >= (uintptr_t)alternate.ss_sp && out->sp - (uintptr_t)alternate.ss_sp < alternate.ss_size) {
        out->on_alternate_stack = 1;
    }
    if (out->sp != 0) {
        int error = 0;
        size_t size = STALLCAPTURE_STACK_BYTES;
        uintptr_t end = out->on_alternate_stack ? (uintptr_t)alternate.ss_sp + alternate.ss_size
                                                : stack_end(out->sp, out->thread_pointer);
        if (end > out->sp && end - out->sp < size) size = end - out->sp;
        out->stack_size = stallcapture_copy_memory_with(taken, out->stack, out->sp, size, &error);
        if (out->stack_size == 0) out->copy_error = error;
    }
}

static void fill_sample(stallcapture_sample *out, void *context) {
    fill_registers(out, context);
    // One pipe for the sample's three copies: taken and its ends checked once.
    int taken = stallcapture_copy_begin();
    fill_thread_words(out, taken);
    fill_stack(out, taken);
    stallcapture_copy_end(taken);
}

static void chain(int signal_number, siginfo_t *info, void *context) {
    if (previous_action.sa_flags & SA_SIGINFO) {
        if (previous_action.sa_sigaction != NULL) previous_action.sa_sigaction(signal_number, info, context);
    } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN &&
               previous_action.sa_handler != NULL) {
        previous_action.sa_handler(signal_number);
    }
    // SIG_DFL would end the process for a stray SIGPROF; SafeTimers ignores it instead.
}

// The threads inside the handler or just out of it, at index tid % 64: the
// thread's id in the high half, in the low half the millisecond it left
// (monotonic, wrapping) or INSIDE_HANDLER. The handler runs with SIGPROF
// blocked until it has returned, so a thread preempted on its way out (the
// sampler it woke runs first) shows the signal blocked for a time slice or
// more: such a thread does not block the signal itself. Two threads at one
// index overwrite each other; the one overwritten is then taken at its mask's
// word, as before this table.
#define HANDLER_THREADS 64
#define INSIDE_HANDLER 0xFFFFFFFFu
static _Atomic uint64_t handler_threads[HANDLER_THREADS];

static uint32_t monotonic_milliseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint32_t)((uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u);
}

static void note_handler(pid_t self, uint32_t left) {
    atomic_store_explicit(&handler_threads[(uint32_t)self % HANDLER_THREADS],
                          ((uint64_t)(uint32_t)self << 32) | left, memory_order_release);
}

int stallcapture_in_handler(pid_t tid, uint32_t within_ms) {
    uint64_t entry = atomic_load_explicit(&handler_threads[(uint32_t)tid % HANDLER_THREADS], memory_order_acquire);
    if ((pid_t)(entry >> 32) != tid) return 0;
    uint32_t left = (uint32_t)entry;
    return left == INSIDE_HANDLER || monotonic_milliseconds() - left <= within_ms;
}

// The threads running a detector's probe, or that ran one: the thread's id in
// the high half, in the low half its begins and ends counted (odd: inside). A
// thread's entry is in one of PROBE_WAYS slots from index tid % 256: a thread
// beginning a probe takes its own slot, else one whose thread is not inside a
// probe, else (every slot held by a thread inside one) the first, overwriting
// it; the one overwritten is then not known to run a probe. (With one slot an
// index, a test process's other probe threads overwrote a sleeping thread's
// entry while it was sampled, and its probe's wait was taken for its stall.)
// Every write is a compare-and-exchange, so a slot taken meanwhile is never
// written over.
#define PROBE_THREADS 256
#define PROBE_WAYS 4
static _Atomic uint64_t probe_threads[PROBE_THREADS];

static _Atomic uint64_t *probe_slot(pid_t tid, int way) {
    return &probe_threads[((uint32_t)tid + (uint32_t)way) % PROBE_THREADS];
}

// Moves `self`'s own entry to `inside`; 0 when it has no slot (it was taken).
static int note_own_probe(pid_t self, int inside) {
    for (int way = 0; way < PROBE_WAYS; way++) {
        _Atomic uint64_t *slot = probe_slot(self, way);
        uint64_t entry = atomic_load_explicit(slot, memory_order_relaxed);
        if ((pid_t)(entry >> 32) != self) continue;
        uint32_t count = (uint32_t)entry;
        if ((count & 1u) != (uint32_t)inside) count += 1;
        uint64_t next = ((uint64_t)(uint32_t)self << 32) | count;
        if (atomic_compare_exchange_strong_explicit(slot, &entry, next, memory_order_release, memory_order_relaxed))
            return 1;
    }
    return 0;
}

static void note_probe(int inside) {
    pid_t self = stallcapture_current_tid();
    if (note_own_probe(self, inside) || !inside) return;
    uint64_t first = ((uint64_t)(uint32_t)self << 32) | 1u;
    for (int way = 0; way < PROBE_WAYS; way++) {
        _Atomic uint64_t *slot = probe_slot(self, way);
        uint64_t entry = atomic_load_explicit(slot, memory_order_relaxed);
        if ((entry & 1u) != 0) continue;  // its thread is inside a probe
        if (atomic_compare_exchange_strong_explicit(slot, &entry, first, memory_order_release, memory_order_relaxed))
            return;
    }
    atomic_store_explicit(probe_slot(self, 0), first, memory_order_release);
}

void stallcapture_probe_begin(void) { note_probe(1); }
void stallcapture_probe_end(void) { note_probe(0); }

uint64_t stallcapture_probe_mark(pid_t tid) {
    for (int way = 0; way < PROBE_WAYS; way++) {
        uint64_t entry = atomic_load_explicit(probe_slot(tid, way), memory_order_acquire);
        if ((pid_t)(entry >> 32) == tid) return entry;
    }
    return 0;
}

// Touches no thread-local storage, `errno` included (its system calls are made
// directly), so it neither saves nor restores `errno`: a thread whose thread
// pointer is not glibc's is sampled like any other.
static void handler(int signal_number, siginfo_t *info, void *context) {
    pid_t self = (pid_t)STALLCAPTURE_SYSCALL0(SYS_gettid);
    note_handler(self, INSIDE_HANDLER);
    int answered = 0;
    if (info != NULL && info->si_code == SI_TKILL && info->si_pid == (pid_t)STALLCAPTURE_SYSCALL0(SYS_getpid)) {
        for (int index = 0; index < STALLCAPTURE_SLOTS; index++) {
            pid_t expected = self;
            if (!atomic_compare_exchange_strong(&slots[index].tid, &expected, -1)) continue;
            atomic_store(&slots[index].answering, self);
            fill_sample(slots[index].out, context);
            atomic_store(&slots[index].answering, 0);
            atomic_store(&slots[index].tid, 0);
            sem_post(&slots[index].done);
            answered = 1;
        }
    }
    if (!answered) chain(signal_number, info, context);
    uint32_t left = monotonic_milliseconds();
    note_handler(self, left == INSIDE_HANDLER ? left - 1 : left);
}

// Calls every library function the handler calls, once, before the handler can
// run: their PLT slots are bound lazily at the first call, and binding inside the
// handler ran on the sampled thread's stack (~2.5 KB more than the handler needs):
// a thread with 4-6 KB of stack left died of SIGSEGV at its first sample.
static void bind_handler_functions(void) {
    unsigned char byte = 0, copy = 0;
    int copy_error = 0;
    (void)stallcapture_copy_memory(&copy, (uintptr_t)&byte, 1, &copy_error);
    struct timespec now;
    (void)clock_gettime(CLOCK_MONOTONIC, &now);
    sem_t bound;
    if (sem_init(&bound, 0, 0) == 0) {
        sem_post(&bound);
        sem_destroy(&bound);
    }
}

static void install(void) {
#if defined(__x86_64__)
    fs_base_readable = (getauxval(AT_HWCAP2) & HWCAP2_FSGSBASE) != 0;
#endif
    (void)stallcapture_copy_pipes_open();
    read_main_stack_end();
    bind_handler_functions();
    locate_queue_slot();
    locate_tid_slot();
    for (int index = 0; index < STALLCAPTURE_SLOTS; index++) {
        if (sem_init(&slots[index].done, 0, 0) != 0) {
            install_result = errno;
            return;
        }
    }
    if (sem_init(&slots_free, 0, STALLCAPTURE_SLOTS) != 0) {
        install_result = errno;
        return;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = handler;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    // No other handler runs inside this one: a handler that leaves by
    // `siglongjmp` (a timeout idiom) abandoned a sample half made, its slot and
    // its pipe taken for good. The synchronous signals stay open (blocking them
    // turns a fault into the process's end).
    sigfillset(&action.sa_mask);
    sigdelset(&action.sa_mask, SIGSEGV);
    sigdelset(&action.sa_mask, SIGBUS);
    sigdelset(&action.sa_mask, SIGILL);
    sigdelset(&action.sa_mask, SIGFPE);
    sigdelset(&action.sa_mask, SIGTRAP);
    if (sigaction(SIGPROF, &action, &previous_action) != 0) install_result = errno;
}

int stallcapture_install(void) {
    pthread_once(&install_once, install);
    return install_result;
}

uintptr_t stallcapture_signal_handler(int signal_number) {
    struct sigaction current;
    if (sigaction(signal_number, NULL, &current) != 0) return 0;
    if (current.sa_flags & SA_SIGINFO) return (uintptr_t)current.sa_sigaction;
    return (uintptr_t)current.sa_handler;
}

/// Takes a free slot (waiting while all are taken).
static request_slot *take_slot(void) {
    while (sem_wait(&slots_free) != 0) {}
    for (;;) {
        for (int index = 0; index < STALLCAPTURE_SLOTS; index++) {
            int expected = 0;
            if (atomic_compare_exchange_strong(&slots[index].taken, &expected, 1)) return &slots[index];
        }
    }
}

static void release_slot(request_slot *slot) {
    slot->out = NULL;
    atomic_store(&slot->taken, 0);
    sem_post(&slots_free);
}

/// Waits for the slot's answer until `timeout_ms`; withdraws the request when
/// none came, unless the handler is answering it right now.
// Waits for a handler that took the slot to post it, checking every 100 ms that
// its thread still exists. A thread gone for good leaves the slot to be taken
// again (nothing writes to its sample any more).
static int await_handler(request_slot *slot, pid_t tid) {
    for (;;) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_nsec += 100000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec += 1;
            deadline.tv_nsec -= 1000000000L;
        }
        if (sem_timedwait(&slot->done, &deadline) == 0) return STALLCAPTURE_OK;
        if (errno == EINTR) continue;
        if (syscall(SYS_tgkill, getpid(), tid, 0) != 0 && errno == ESRCH) {
            atomic_store(&slot->answering, 0);
            atomic_store(&slot->tid, 0);
            return STALLCAPTURE_TIMEOUT;
        }
    }
}

static int await_answer(request_slot *slot, pid_t tid, int timeout_ms) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    while (sem_timedwait(&slot->done, &deadline) != 0) {
        if (errno == EINTR) continue;
        pid_t expected = tid;
        if (atomic_compare_exchange_strong(&slot->tid, &expected, 0)) return STALLCAPTURE_TIMEOUT;
        // The handler is filling the slot: wait for it, as long as its thread
        // lives (a thread killed inside the handler, by a seccomp filter that
        // kills on a call the handler makes, never posts).
        return await_handler(slot, tid);
    }
    return STALLCAPTURE_OK;
}

int stallcapture_capture(pid_t tid, int timeout_ms, stallcapture_sample *out, int *error_number) {
    if (stallcapture_install() != 0) return STALLCAPTURE_NOT_INSTALLED;
    // Signal only while the handler is still ours: code that set SIGPROF back
    // to SIG_DFL after the detector started would be killed by the signal
    // ("Profiling timer expired"); a handler installed over ours would get a
    // signal it did not ask for.
    struct sigaction current;
    if (sigaction(SIGPROF, NULL, &current) != 0 || !(current.sa_flags & SA_SIGINFO)
        || current.sa_sigaction != handler) {
        return STALLCAPTURE_HANDLER_REPLACED;
    }
    request_slot *slot = take_slot();
    while (sem_trywait(&slot->done) == 0) {}  // nothing stale may count as an answer
    slot->out = out;
    struct timespec now;
    out->sent_ns = clock_gettime(CLOCK_MONOTONIC, &now) == 0
        ? (int64_t)now.tv_sec * 1000000000 + (int64_t)now.tv_nsec : 0;
    atomic_store(&slot->tid, tid);
    if (syscall(SYS_tgkill, getpid(), tid, SIGPROF) != 0) {
        if (error_number) *error_number = errno;
        atomic_store(&slot->tid, 0);
        release_slot(slot);
        return STALLCAPTURE_SIGNAL_FAILED;
    }
    int result = await_answer(slot, tid, timeout_ms);
    release_slot(slot);
    return result;
}

#else

int stallcapture_install(void) { return 0; }
int stallcapture_capture(pid_t tid, int timeout_ms, stallcapture_sample *out, int *error_number) {
    (void)tid; (void)timeout_ms; (void)out; (void)error_number;
    return STALLCAPTURE_UNSUPPORTED;
}
pid_t stallcapture_current_tid(void) { return 0; }
int stallcapture_is_answering(pid_t tid) { (void)tid; return 0; }
int stallcapture_in_handler(pid_t tid, uint32_t within_ms) { (void)tid; (void)within_ms; return 0; }
void stallcapture_probe_begin(void) {}
void stallcapture_probe_end(void) {}
uint64_t stallcapture_probe_mark(pid_t tid) { (void)tid; return 0; }
uintptr_t stallcapture_thread_pointer(void) { return 0; }
int stallcapture_queue_of_thread(pid_t tid, uintptr_t thread_pointer, uintptr_t *queue) {
    (void)tid; (void)thread_pointer; (void)queue;
    return 0;
}
uintptr_t stallcapture_signal_handler(int signal_number) { (void)signal_number; return 0; }
uintptr_t stallcapture_tls_word(intptr_t offset) { (void)offset; return 0; }
void stallcapture_set_task_slot(intptr_t offset) { (void)offset; }
int stallcapture_task_of_thread(pid_t tid, uintptr_t thread_pointer, uintptr_t *task) {
    (void)tid; (void)thread_pointer; (void)task;
    return 0;
}

#endif

// The calling thread's mark (see the header); every platform.
static __thread uint32_t thread_mark;
uint32_t stallcapture_thread_mark(void) { return thread_mark; }
void stallcapture_set_thread_mark(uint32_t mark) { thread_mark = mark; }
