#ifndef C_STALL_DRAIN_LOCK_H
#define C_STALL_DRAIN_LOCK_H

#include <stdint.h>
#include <sys/types.h>

// Which thread drains a serial dispatch queue, read from the queue itself.
//
// libdispatch keeps a serial queue's drain lock in the low 32 bits of the queue's
// state word (`dq_state`): while a thread runs the queue's jobs (an `async` job on
// a worker, or a `sync` caller running its block), they hold that thread's kernel
// id (Linux: `gettid()`, masked by FUTEX_TID_MASK); between jobs they are 0. The
// word's place in the queue object is private to libdispatch, so it is located
// once per process, at the first call: on two new queues, on two threads, the one
// 8-byte word whose low bits hold the draining thread's id during a job and no
// thread's id outside it. Not found (another libdispatch layout): every call
// answers -1, and callers find the thread another way.

/// The kernel id of the thread that drains serial queue `queue` (the address of
/// the libdispatch queue object) now; 0 when no thread drains it (it waits for a
/// thread, is suspended, or has nothing to run); -1 when the drain lock's place
/// is unknown or the queue's memory cannot be read. Reads through the kernel
/// (`process_vm_readv`): a stale address gives a wrong answer, never a fault.
pid_t stallcapture_queue_drainer(uintptr_t queue);

/// Whether the drain lock was located (locating it on the first call).
int stallcapture_drain_lock_located(void);

#endif
