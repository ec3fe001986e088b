#!/usr/bin/env python3
"""Fails when Swift code under Sources/ uses a symbol that exists only in glibc
(Linux) outside a Linux-only conditional-compilation block, so that Apple
platforms keep compiling although no machine here can build for them.

A line counts as Linux-only when an enclosing `#if`/`#elseif` branch names
`os(Linux)`, `canImport(Glibc)` or `canImport(Musl)` (not negated). Symbols in
string literals (names looked up with `dlsym`) and comments are ignored.
C files are not checked: the C shim guards itself with the preprocessor.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Declared by glibc (or the Linux kernel headers it exposes) and not by Darwin.
GLIBC_ONLY = [
    "gettid", "tgkill", "prctl", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "eventfd", "timerfd_create", "timerfd_settime", "process_vm_readv", "process_vm_writev",
    "__rusage_who_t", "dl_iterate_phdr", "dl_phdr_info", "pthread_getattr_np", "sched_getcpu",
    "sigtimedwait", "signalfd", "mallinfo", "mallinfo2", "malloc_usable_size", "memfd_create",
    "SYS_gettid", "SYS_tgkill", "CLOCK_BOOTTIME", "CLOCK_MONOTONIC_COARSE", "PR_SET_TIMERSLACK",
    "Glibc.", "ElfW", "Elf64_", "linux_dirent",
]
PATTERN = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(re.escape(s) for s in GLIBC_ONLY) + r")(?![A-Za-z0-9_])")
LINUX = re.compile(r"(?<!!)\b(os\(Linux\)|canImport\((Glibc|Musl)\))")


def strip(line):
    """The line without string literals and comments."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    return line.split("//", 1)[0]


def check(path):
    problems = []
    stack = []  # per open #if: whether the current branch is Linux-only
    for number, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = raw.strip()
        if line.startswith("#if"):
            stack.append(bool(LINUX.search(line)) and "!" not in line.split("os(Linux)")[0][-2:])
            continue
        if line.startswith("#elseif"):
            stack[-1] = bool(LINUX.search(line))
            continue
        if line.startswith("#else"):
            stack[-1] = False
            continue
        if line.startswith("#endif"):
            stack.pop()
            continue
        if any(stack):
            continue
        match = PATTERN.search(strip(raw))
        if match:
            problems.append(f"{os.path.relpath(path, ROOT)}:{number}: '{match.group(1)}' is glibc-only; "
                            f"guard it with #if os(Linux) / canImport(Glibc) and give Darwin its branch")
    return problems


def main():
    problems = []
    for folder, _, files in os.walk(os.path.join(ROOT, "Sources")):
        for name in sorted(files):
            if name.endswith(".swift"):
                problems += check(os.path.join(folder, name))
    for problem in problems:
        print(problem)
    print(f"platform check: {len(problems)} glibc-only uses outside Linux blocks")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
