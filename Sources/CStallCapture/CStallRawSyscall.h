#ifndef C_STALL_RAW_SYSCALL_H
#define C_STALL_RAW_SYSCALL_H

// System calls for the SIGPROF handler that touch no thread-local storage.
//
// libc's wrappers store a failure's code in `errno`, a thread-local variable
// that glibc finds through the thread pointer. A thread whose thread pointer is
// not glibc's (a runtime that sets the FS base itself with `arch_prctl`) faults
// there, inside the handler, and the process ends; and the handler's copies
// fail by design (EFAULT at the first unreadable page). These make the system
// call directly and return the kernel's result: the value, or -errno.
// Private to CStallCapture.

#if defined(__linux__)

#include <stdint.h>
#include <sys/syscall.h>

#if defined(__x86_64__)

static inline long stallcapture_raw_syscall(long number, long a, long b, long c, long d, long e, long f) {
    long result;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(result)
                     : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return result;
}

#elif defined(__aarch64__)

static inline long stallcapture_raw_syscall(long number, long a, long b, long c, long d, long e, long f) {
    register long x8 __asm__("x8") = number;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
}

#else

#include <errno.h>
#include <unistd.h>

// Another architecture: libc's `syscall`, which does use `errno` on failure.
static inline long stallcapture_raw_syscall(long number, long a, long b, long c, long d, long e, long f) {
    int saved = errno;
    long result = syscall(number, a, b, c, d, e, f);
    if (result == -1) result = -(long)errno;
    errno = saved;
    return result;
}

#endif

#define STALLCAPTURE_SYSCALL0(n) stallcapture_raw_syscall((n), 0, 0, 0, 0, 0, 0)
#define STALLCAPTURE_SYSCALL2(n, a, b) stallcapture_raw_syscall((n), (long)(a), (long)(b), 0, 0, 0, 0)
#define STALLCAPTURE_SYSCALL3(n, a, b, c) stallcapture_raw_syscall((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define STALLCAPTURE_SYSCALL6(n, a, b, c, d, e, f)                                                               \
    stallcapture_raw_syscall((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

#endif

#endif
