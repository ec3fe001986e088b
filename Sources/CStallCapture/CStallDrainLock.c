#define _GNU_SOURCE
#include "CStallDrainLock.h"

#if defined(__linux__)

#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

// Declared by libdispatch; the Swift overlay does not import them.
extern void *dispatch_get_current_queue(void);
extern void *dispatch_queue_create(const char *label, void *attributes);
extern void dispatch_sync_f(void *queue, void *context, void (*work)(void *));
extern void dispatch_release(void *object);

// The kernel's mask of a thread id in a futex word; libdispatch's DLOCK_OWNER_MASK on Linux.
#define DRAIN_OWNER_MASK 0x3fffffffu
// Where the search for the state word looks: after the object header's pointers.
#define FIRST_OFFSET 16
#define LAST_OFFSET 120

static pthread_once_t locate_once = PTHREAD_ONCE_INIT;
// The state word's offset in a queue object; -1 until located, or when not found.
static _Atomic long drain_lock_offset = -1;

static int read_word(uintptr_t address, uint64_t *word) {
    struct iovec local = {word, sizeof *word};
    struct iovec remote = {(void *)address, sizeof *word};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)sizeof *word ? 0 : -1;
}

// What one queue shows: its words outside any job, then (in a job on it) the
// first offset whose owner bits hold the calling thread's id and held none before.
typedef struct {
    uint64_t idle[(LAST_OFFSET - FIRST_OFFSET) / 8 + 1];
    long found;
} probe;

static void find_in_job(void *context) {
    probe *probe = context;
    uintptr_t queue = (uintptr_t)dispatch_get_current_queue();
    pid_t tid = (pid_t)syscall(SYS_gettid);
    for (long offset = FIRST_OFFSET; offset <= LAST_OFFSET; offset += 8) {
        uint64_t word = 0;
        uint64_t before = probe->idle[(offset - FIRST_OFFSET) / 8];
        if (read_word(queue + (uintptr_t)offset, &word) != 0) return;
        if ((word & DRAIN_OWNER_MASK) == (uint64_t)tid && (before & DRAIN_OWNER_MASK) == 0) {
            probe->found = offset;
            return;
        }
    }
}

// The offset found on a new queue by the calling thread, checked again after the
// job (the owner bits cleared); -1 when not found.
static long offset_on_new_queue(const char *label) {
    void *queue = dispatch_queue_create(label, NULL);
    if (queue == NULL) return -1;
    probe probe = {.found = -1};
    for (long offset = FIRST_OFFSET; offset <= LAST_OFFSET; offset += 8) {
        if (read_word((uintptr_t)queue + (uintptr_t)offset, &probe.idle[(offset - FIRST_OFFSET) / 8]) != 0) {
            dispatch_release(queue);
            return -1;
        }
    }
    dispatch_sync_f(queue, &probe, find_in_job);
    uint64_t after = 0;
    if (probe.found >= 0 &&
        (read_word((uintptr_t)queue + (uintptr_t)probe.found, &after) != 0 || (after & DRAIN_OWNER_MASK) != 0)) {
        probe.found = -1;
    }
    dispatch_release(queue);
    return probe.found;
}

static void *offset_on_other_thread(void *result) {
    *(long *)result = offset_on_new_queue("SafeTimers.StallDetection.drain-lock-2");
    return NULL;
}

static void locate(void) {
    long here = offset_on_new_queue("SafeTimers.StallDetection.drain-lock-1");
    if (here < 0) return;
    long there = -1;
    pthread_t other;
    if (pthread_create(&other, NULL, offset_on_other_thread, &there) != 0) return;
    pthread_join(other, NULL);
    if (there == here) atomic_store_explicit(&drain_lock_offset, here, memory_order_release);
}

int stallcapture_drain_lock_located(void) {
    pthread_once(&locate_once, locate);
    return atomic_load_explicit(&drain_lock_offset, memory_order_acquire) >= 0;
}

pid_t stallcapture_queue_drainer(uintptr_t queue) {
    if (queue == 0 || !stallcapture_drain_lock_located()) return -1;
    uint64_t word = 0;
    long offset = atomic_load_explicit(&drain_lock_offset, memory_order_acquire);
    if (read_word(queue + (uintptr_t)offset, &word) != 0) return -1;
    return (pid_t)(word & DRAIN_OWNER_MASK);
}

#else

int stallcapture_drain_lock_located(void) { return 0; }

pid_t stallcapture_queue_drainer(uintptr_t queue) {
    (void)queue;
    return -1;
}

#endif
