#ifndef C_STALL_CAPTURE_H
#define C_STALL_CAPTURE_H

// The only C in SafeTimers: an async-signal-safe SIGPROF handler that samples the
// stack of one chosen thread, and the calls that drive it. Everything else
// (choosing the thread, merging the unwinds, symbolication) happens in Swift, on
// the detector's thread, after the sample.

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "CStallActivity.h"
#include "CStallDrainLock.h"
#include "CStallMemoryCopy.h"
#include "CStallProcess.h"

#if defined(__linux__)
// System declarations that Swift's Glibc module does not export, used from Swift
// (no C code goes with them): process_vm_readv (a read of this process' memory
// that cannot fault), and epoll, eventfd and pthread_setname_np for the stop witness.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <sys/uio.h>
// Declared by glibc only under _GNU_SOURCE, which Swift's Glibc module lacks.
extern ssize_t process_vm_readv(pid_t pid, const struct iovec *local_iov, unsigned long int liovcnt,
                                const struct iovec *remote_iov, unsigned long int riovcnt, unsigned long int flags);
extern int pthread_setname_np(pthread_t thread, const char *name);
#endif

#define STALLCAPTURE_STACK_BYTES 262144

/// One sample of a thread's stack, filled inside the signal handler.
typedef struct stallcapture_sample {
    /// The interrupted thread's registers: program counter, stack pointer, frame pointer.
    uintptr_t pc;
    uintptr_t sp;
    uintptr_t fp;
    /// The dispatch queue whose job the thread was running when interrupted (0
    /// outside any job), so that a worker that moved on to another queue's job
    /// is not taken for this queue's; meaningful only when `queue_known` is 1.
    uintptr_t queue;
    /// 1 when `queue` was read; 0 when libdispatch's record of it could not be
    /// located at install (the queue is then unknown).
    int queue_known;
    /// The Swift task the thread was running when interrupted (0 outside any
    /// task), read from the concurrency runtime's thread-local slot; meaningful
    /// only when `task_known` is 1 (the slot was located: ``stallcapture_set_task_slot``).
    uintptr_t task;
    int task_known;
    /// The interrupted thread's thread pointer (its TLS base): its task slot is
    /// read again through it after the task's fields were read.
    uintptr_t thread_pointer;
    /// A copy of the stack from `sp` upward, as far as it is mapped (at most
    /// STALLCAPTURE_STACK_BYTES); the frame-pointer walk and the return-address
    /// scan read this copy, never the live stack.
    size_t stack_size;
    /// errno of the copy's first failed read when nothing was copied (EFAULT: `sp`
    /// is not readable; EPERM or ENOSYS: no copy pipe was free and
    /// `process_vm_readv` was refused, as a seccomp filter does), else 0.
    int copy_error;
    /// 1 when `sp` lies on the thread's alternate signal stack (`sigaltstack`):
    /// the copy then ends with that stack, not with the thread's own.
    int on_alternate_stack;
    /// CLOCK_MONOTONIC nanoseconds when the handler ran: the moment the copied
    /// stack was the thread's.
    int64_t time_ns;
    /// CLOCK_MONOTONIC nanoseconds when the signal was sent (written by the
    /// sampler, never by the handler).
    int64_t sent_ns;
    unsigned char stack[STALLCAPTURE_STACK_BYTES];
} stallcapture_sample;

/// The copied stack bytes (Swift does not import C arrays this large).
static inline const unsigned char *stallcapture_sample_stack(const stallcapture_sample *sample) {
    return sample->stack;
}

/// Outcomes of `stallcapture_capture`.
enum {
    STALLCAPTURE_OK = 0,
    /// The thread did not answer in time (signal blocked, uninterruptible sleep, stopped).
    STALLCAPTURE_TIMEOUT = 1,
    /// The signal could not be sent (the thread is gone: errno says why).
    STALLCAPTURE_SIGNAL_FAILED = 2,
    /// The handler could not be installed.
    STALLCAPTURE_NOT_INSTALLED = 3,
    /// Not supported on this platform.
    STALLCAPTURE_UNSUPPORTED = 4,
    /// Other code replaced the SIGPROF handler (or reset it to the default, which
    /// would kill the process): no signal is sent.
    STALLCAPTURE_HANDLER_REPLACED = 5,
};

/// Installs the SIGPROF handler once per process (idempotent, thread-safe).
/// Chains SIGPROF signals that are not its own requests to the handler that was
/// installed before. Returns 0, or an errno value.
int stallcapture_install(void);

/// Samples the stack of thread `tid` of this process into `out`, waiting at most
/// `timeout_ms`. One capture runs at a time; concurrent callers wait their turn.
/// Returns one of the STALLCAPTURE_* outcomes; `*error_number` gets errno on
/// STALLCAPTURE_SIGNAL_FAILED.
int stallcapture_capture(pid_t tid, int timeout_ms, stallcapture_sample *out, int *error_number);

/// The address of the handler of signal `signal_number` installed now
/// (`sa_sigaction` or `sa_handler`: 0 for SIG_DFL, 1 for SIG_IGN), or 0 when it
/// cannot be read.
uintptr_t stallcapture_signal_handler(int signal_number);

/// The kernel id of the calling thread.
pid_t stallcapture_current_tid(void);

/// A word of the calling thread's own, 0 until set: ``ThreadPointers`` keeps in
/// it the generation of its table that holds the thread's pointer, so that a
/// thread already recorded skips the table's lock.
uint32_t stallcapture_thread_mark(void);
void stallcapture_set_thread_mark(uint32_t mark);

/// The calling thread's thread pointer (its TLS base), for
/// `stallcapture_queue_of_thread`.
uintptr_t stallcapture_thread_pointer(void);

/// The dispatch queue whose job thread `tid`, whose thread pointer is
/// `thread_pointer`, runs now (0 outside any job), read from libdispatch's
/// thread-local record through the kernel (never a fault), asleep or running.
/// Returns 1 when read; 0 when the record's place is unknown (not located at
/// install), unreadable, or holds another thread's id (the thread exited and its
/// id or memory was reused).
int stallcapture_queue_of_thread(pid_t tid, uintptr_t thread_pointer, uintptr_t *queue);

/// The calling thread's thread-local word at `offset` from its thread pointer,
/// read through the kernel (0 when unreadable).
uintptr_t stallcapture_tls_word(intptr_t offset);

/// From now on the handler reads each sampled thread's current Swift task
/// from the word at `offset` from its thread pointer.
void stallcapture_set_task_slot(intptr_t offset);

/// The Swift task thread `tid`, whose thread pointer is `thread_pointer`, runs
/// now (0: none), read through the kernel from the slot set by
/// ``stallcapture_set_task_slot``, asleep or running. Returns 1 when read; 0
/// when the slot is not set, unreadable, or the thread descriptor at
/// `thread_pointer` holds another thread's id (the thread exited and glibc
/// gave its memory to a new one).
int stallcapture_task_of_thread(pid_t tid, uintptr_t thread_pointer, uintptr_t *task);

/// Whether thread `tid` is inside the handler right now, filling another
/// capture's sample: it was running (it took a signal), and its stack read
/// from outside would show the handler, not the code it interrupted.
int stallcapture_is_answering(pid_t tid);

/// Whether thread `tid` is inside the SIGPROF handler (answering, or running a
/// handler installed before it) or left it at most `within_ms` milliseconds
/// ago: a thread that shows SIGPROF blocked then is on its way out of the
/// handler, not blocking the signal itself.
int stallcapture_in_handler(pid_t tid, uint32_t within_ms);

/// The calling thread starts (`stallcapture_probe_begin`) or ends
/// (`stallcapture_probe_end`) running a detector's probe on its target: a
/// probe that runs has ended the stall it answers, and the time it takes
/// (waiting for a lock the detector holds, on a crowded machine) is the
/// detector's, not the target's. Lock-free: two atomic stores.
void stallcapture_probe_begin(void);
void stallcapture_probe_end(void);

/// Thread `tid`'s probe record (its id in the high half, in the low half a
/// count of its begins and ends: odd while it runs a probe), or 0 when none
/// of the slots it may be in holds it. Two reads that differ, or an odd one,
/// bracket a moment the thread ran a probe.
uint64_t stallcapture_probe_mark(pid_t tid);

#endif
