#define _GNU_SOURCE
#include "CStallMemoryCopy.h"
#include "CStallRawSyscall.h"

#if defined(__linux__)

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

// Handlers copying at the same moment (one detector per event loop samples its
// thread at the same time as the others) each need a pipe of their own.
#define COPY_PIPES 8
// A pipe holds this much; a stack copy of 256 KB takes one write and one read.
#define PIPE_BYTES (256 * 1024)
#define PAGE_BYTES 4096

enum { PIPE_FREE = 0, PIPE_TAKEN = 1, PIPE_LOST = 2 };

typedef struct {
    int read_end;
    int write_end;
    // The pipe's identity: a descriptor the program closed (and the number given
    // to another file) is never written to.
    dev_t device;
    ino_t inode;
    size_t capacity;
    _Atomic int state;
} copy_pipe;

static copy_pipe pipes[COPY_PIPES];
static int pipe_count;
// The process that opened the pipes: a forked child shares them with its
// parent, so it copies through `process_vm_readv`.
static pid_t pipes_owner;
static pthread_once_t open_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t copies_without_pipe;

static void open_pipes(void) {
    for (int index = 0; index < COPY_PIPES; index++) {
        int ends[2];
        if (pipe2(ends, O_NONBLOCK | O_CLOEXEC) != 0) break;
        struct stat status;
        if (fstat(ends[1], &status) != 0) {
            close(ends[0]);
            close(ends[1]);
            break;
        }
        int capacity = fcntl(ends[1], F_SETPIPE_SZ, PIPE_BYTES);
        if (capacity <= 0) capacity = fcntl(ends[1], F_GETPIPE_SZ);
        copy_pipe *pipe = &pipes[pipe_count];
        pipe->read_end = ends[0];
        pipe->write_end = ends[1];
        pipe->device = status.st_dev;
        pipe->inode = status.st_ino;
        pipe->capacity = capacity > 0 ? (size_t)capacity : PAGE_BYTES * 16;
        atomic_store(&pipe->state, PIPE_FREE);
        pipe_count += 1;
    }
    pipes_owner = (pid_t)syscall(SYS_getpid);
}

int stallcapture_copy_pipes_open(void) {
    pthread_once(&open_once, open_pipes);
    return pipe_count;
}

// Whether `descriptor` is still `pipe`'s end opened for `access` (O_RDONLY or
// O_WRONLY): both ends share one inode, so a write end copied over the read
// end's number (leaving the pipe no reader: SIGPIPE) fails the access check.
// (The handler's system calls here and below are made directly: no `errno`.)
static int is_this_pipe(int descriptor, const copy_pipe *pipe, int access) {
    struct stat status;
    long flags = STALLCAPTURE_SYSCALL2(SYS_fcntl, descriptor, F_GETFL);
    return flags >= 0 && (flags & O_ACCMODE) == access && STALLCAPTURE_SYSCALL2(SYS_fstat, descriptor, &status) == 0
        && S_ISFIFO(status.st_mode) && status.st_dev == pipe->device && status.st_ino == pipe->inode;
}

// A free pipe of this process, taken; NULL when none is.
static copy_pipe *take_pipe(void) {
    if (pipe_count == 0 || (pid_t)STALLCAPTURE_SYSCALL0(SYS_getpid) != pipes_owner) return NULL;
    unsigned first = (unsigned)STALLCAPTURE_SYSCALL0(SYS_gettid);
    for (int step = 0; step < pipe_count; step++) {
        copy_pipe *pipe = &pipes[(first + (unsigned)step) % (unsigned)pipe_count];
        int expected = PIPE_FREE;
        if (!atomic_compare_exchange_strong(&pipe->state, &expected, PIPE_TAKEN)) continue;
        int queued = 0;
        if (is_this_pipe(pipe->write_end, pipe, O_WRONLY) && is_this_pipe(pipe->read_end, pipe, O_RDONLY)
            && STALLCAPTURE_SYSCALL3(SYS_ioctl, pipe->read_end, FIONREAD, &queued) == 0 && queued == 0) {
            return pipe;
        }
        // Closed by the program (its numbers may be another file's now), or
        // holding bytes a read that went elsewhere left (every later copy
        // through it would be shifted).
        atomic_store(&pipe->state, PIPE_LOST);
    }
    return NULL;
}

int stallcapture_copy_begin(void) {
    copy_pipe *pipe = take_pipe();
    return pipe == NULL ? -1 : (int)(pipe - pipes);
}

void stallcapture_copy_end(int taken) {
    if (taken < 0 || taken >= pipe_count) return;
    int expected = PIPE_TAKEN;
    // A pipe found broken during the copies stays lost.
    (void)atomic_compare_exchange_strong(&pipes[taken].state, &expected, PIPE_FREE);
}

// Copies through `pipe` (taken by the caller, and left taken): from `address`
// to its page's end, then a pipe's capacity at a time; the kernel's write stops
// before the first page it cannot read. Returns the bytes copied, or -errno when
// the first write failed. A pipe that gave back other than what was written is
// marked lost.
static ssize_t copy_through(copy_pipe *pipe, unsigned char *into, uintptr_t address, size_t size) {
    size_t total = 0;
    size_t chunk = PAGE_BYTES - (address % PAGE_BYTES);
    while (total < size) {
        if (chunk > size - total) chunk = size - total;
        ssize_t written = STALLCAPTURE_SYSCALL3(SYS_write, pipe->write_end, address + total, chunk);
        if (written <= 0) {
            ssize_t failure = written < 0 ? written : -EFAULT;
            return total == 0 ? failure : (ssize_t)total;
        }
        ssize_t read_back = STALLCAPTURE_SYSCALL3(SYS_read, pipe->read_end, into + total, written);
        if (read_back != written) {
            // Not what was written: the pipe is not used again. With nothing
            // copied yet the kernel's copy is tried (a seccomp filter refusing
            // the read).
            atomic_store(&pipe->state, PIPE_LOST);
            return total == 0 ? -(ssize_t)EIO : (ssize_t)total;
        }
        total += (size_t)written;
        if ((size_t)written < chunk) break;
        chunk = pipe->capacity;
    }
    return (ssize_t)total;
}

// One `process_vm_readv` of this process' memory: the bytes read, or -errno.
static long read_through_kernel(pid_t self, void *into, uintptr_t address, size_t size) {
    struct iovec local = {into, size};
    struct iovec remote = {(void *)address, size};
    return STALLCAPTURE_SYSCALL6(SYS_process_vm_readv, self, &local, 1, &remote, 1, 0);
}

// Copies through the kernel's `process_vm_readv`: the whole range, else page by
// page up to the first that cannot be read.
static size_t copy_through_kernel(unsigned char *into, uintptr_t address, size_t size, int *error) {
    pid_t self = (pid_t)STALLCAPTURE_SYSCALL0(SYS_getpid);
    long copied = read_through_kernel(self, into, address, size);
    if (copied >= 0) return (size_t)copied;
    int first_error = (int)-copied;
    size_t total = 0;
    size_t chunk = PAGE_BYTES - (address % PAGE_BYTES);
    while (total < size) {
        if (chunk > size - total) chunk = size - total;
        if (read_through_kernel(self, into + total, address + total, chunk) != (long)chunk) break;
        total += chunk;
        chunk = PAGE_BYTES;
    }
    if (total == 0) *error = first_error;
    return total;
}

size_t stallcapture_copy_memory_with(int taken, void *into, uintptr_t address, size_t size, int *error) {
    *error = 0;
    if (size == 0) return 0;
    // Only the caller changes a pipe it took, so a pipe still taken is usable.
    if (taken >= 0 && taken < pipe_count && atomic_load(&pipes[taken].state) == PIPE_TAKEN) {
        ssize_t copied = copy_through(&pipes[taken], into, address, size);
        if (copied >= 0) return (size_t)copied;
        if (copied == -EFAULT) {
            *error = EFAULT;
            return 0;
        }
        // Another failure of the write or of the read back (a seccomp filter refusing
        // it): the kernel's copy is tried.
    }
    atomic_fetch_add_explicit(&copies_without_pipe, 1, memory_order_relaxed);
    return copy_through_kernel(into, address, size, error);
}

size_t stallcapture_copy_memory(void *into, uintptr_t address, size_t size, int *error) {
    *error = 0;
    if (size == 0) return 0;
    int taken = stallcapture_copy_begin();
    size_t copied = stallcapture_copy_memory_with(taken, into, address, size, error);
    stallcapture_copy_end(taken);
    return copied;
}

uint64_t stallcapture_copies_without_pipe(void) {
    return atomic_load_explicit(&copies_without_pipe, memory_order_relaxed);
}

#else

int stallcapture_copy_pipes_open(void) { return 0; }
int stallcapture_copy_begin(void) { return -1; }
void stallcapture_copy_end(int taken) { (void)taken; }
size_t stallcapture_copy_memory_with(int taken, void *into, uintptr_t address, size_t size, int *error) {
    (void)taken; (void)into; (void)address; (void)size;
    *error = 0;
    return 0;
}
size_t stallcapture_copy_memory(void *into, uintptr_t address, size_t size, int *error) {
    (void)into; (void)address; (void)size;
    *error = 0;
    return 0;
}
uint64_t stallcapture_copies_without_pipe(void) { return 0; }

#endif
