#ifndef C_STALL_MEMORY_COPY_H
#define C_STALL_MEMORY_COPY_H

#include <stddef.h>
#include <stdint.h>

// Copies of this process' memory that cannot fault, for the SIGPROF handler.
//
// `process_vm_readv` cannot fault either, but it holds the process' memory-map
// lock (for reading) while it pins the pages: a thread preempted inside it (a
// low-priority thread on a busy machine waits hundreds of milliseconds for a
// core) holds the lock all that time, and the next `mmap` or `mprotect` queues
// for it, and every page fault and `process_vm_readv` of every other thread
// behind that. So the handler copies by writing the memory into a pipe and
// reading it back: the kernel's copy from user memory takes no lock for a page
// that is present, and returns EFAULT (never a signal) at one that is not
// readable (unmapped, PROT_NONE, a guard region). A few pipes are kept, each
// taken by one handler at a time; a handler that finds none free copies through
// `process_vm_readv` as before.

/// Opens the pipes, once per process (idempotent, thread-safe). Returns how many
/// are open (0 when `pipe2` failed: every copy then goes through
/// `process_vm_readv`).
int stallcapture_copy_pipes_open(void);

/// Copies up to `size` bytes at `address` into `into`, stopping before the first
/// byte that cannot be read. Returns the bytes copied; when none could be,
/// `*error` gets the errno of the failed read (EFAULT, or EPERM when a seccomp
/// filter refuses the fallback), else 0. Async-signal-safe. `into` should be
/// memory whose pages were touched before: the kernel's write into a page not yet
/// faulted in may take the memory-map lock too.
size_t stallcapture_copy_memory(void *into, uintptr_t address, size_t size, int *error);

/// Takes a free pipe for a run of copies by one thread (the handler's thread-local
/// words and stack: the pipe is taken and checked once, not once a copy).
/// Returns its number, or -1 when none is free (the copies then go through
/// `process_vm_readv`). Async-signal-safe. Give it back with
/// `stallcapture_copy_end`.
int stallcapture_copy_begin(void);

/// `stallcapture_copy_memory` through the pipe `taken` (from
/// `stallcapture_copy_begin`; -1: through `process_vm_readv`).
size_t stallcapture_copy_memory_with(int taken, void *into, uintptr_t address, size_t size, int *error);

/// Gives back a pipe taken by `stallcapture_copy_begin` (-1: nothing to give).
void stallcapture_copy_end(int taken);

/// How many copies went through `process_vm_readv` because no pipe was free
/// (or none could be opened, or the program closed them).
uint64_t stallcapture_copies_without_pipe(void);

#endif
