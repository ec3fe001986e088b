import CStallCapture
import Foundation
import Synchronization
import Testing

@testable import StallDetection

#if os(Linux)
import Glibc

/// A library with thread-local storage: each dlopen and dlclose of it changes the
/// process' TLS generation, so a thread's next access to a TLS variable through
/// `__tls_get_addr` updates its TLS vector (and frees the closed library's block).
private let tlsLibrarySource = """
    __thread char tls_block[8192];
    void tls_touch(void) { tls_block[0]++; tls_block[4000]++; }
    """

/// Runs the SIGPROF handler of `CStallCapture` (built from the package's own C
/// source) against threads that allocate and free all the time while another
/// thread opens and closes `tlsLibrarySource`. Every allocation and free made
/// while SIGPROF is blocked on a worker (only the handler blocks it there) is
/// counted; the counts are printed as `allocations A frees F captures C
/// without-pipe P` (P: copies made with `process_vm_readv`, no pipe being free).
private let handlerHarnessSource = """
    #define _GNU_SOURCE
    #include "CStallCapture.h"
    #include <dlfcn.h>
    #include <pthread.h>
    #include <signal.h>
    #include <stdatomic.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <sys/syscall.h>
    #include <time.h>
    #include <unistd.h>
    #define WORKERS 4
    extern void *__libc_malloc(size_t); extern void __libc_free(void *);
    extern void *__libc_calloc(size_t, size_t); extern void *__libc_realloc(void *, size_t);
    static __thread int is_worker __attribute__((tls_model("initial-exec")));
    static _Atomic long allocations, frees;
    static int in_handler(void) {
        if (!is_worker) return 0;
        sigset_t mask;
        pthread_sigmask(SIG_BLOCK, NULL, &mask);
        return sigismember(&mask, SIGPROF);
    }
    void *malloc(size_t n) { if (in_handler()) allocations++; return __libc_malloc(n); }
    void free(void *p) { if (p && in_handler()) frees++; __libc_free(p); }
    void *calloc(size_t a, size_t b) { if (in_handler()) allocations++; return __libc_calloc(a, b); }
    void *realloc(void *p, size_t n) { if (in_handler()) allocations++; return __libc_realloc(p, n); }
    static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
    static void *handle; static void (*touch)(void);
    static _Atomic pid_t tids[WORKERS]; static _Atomic int stop;
    static const char *library;
    static void *worker(void *arg) {
        is_worker = 1;
        tids[(long)arg] = (pid_t)syscall(SYS_gettid);
        unsigned seed = (unsigned)(long)arg;
        while (!stop) {
            pthread_rwlock_rdlock(&lock);
            if (touch && rand_r(&seed) % 64 == 0) touch();
            pthread_rwlock_unlock(&lock);
            for (int k = 0; k < 200; k++) free(malloc(16 + (k * 37) % 2000));
        }
        return NULL;
    }
    static void *loader(void *arg) {
        (void)arg;
        while (!stop) {
            pthread_rwlock_wrlock(&lock);
            if (handle) { dlclose(handle); handle = NULL; touch = NULL; }
            handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
            touch = handle ? (void (*)(void))dlsym(handle, "tls_touch") : NULL;
            pthread_rwlock_unlock(&lock);
            usleep(200);
        }
        return NULL;
    }
    int main(int argc, char **argv) {
        if (argc < 3) return 2;
        library = argv[1];
        int seconds = atoi(argv[2]);
        if (stallcapture_install() != 0) return 3;
        pthread_t threads[WORKERS + 1];
        for (long i = 0; i < WORKERS; i++) pthread_create(&threads[i], NULL, worker, (void *)i);
        pthread_create(&threads[WORKERS], NULL, loader, NULL);
        stallcapture_sample *sample = __libc_malloc(sizeof *sample);
        long captures = 0;
        time_t end = time(NULL) + seconds;
        while (time(NULL) < end) {
            for (int i = 0; i < WORKERS; i++) {
                int error = 0;
                if (tids[i] && stallcapture_capture(tids[i], 100, sample, &error) == STALLCAPTURE_OK) captures++;
            }
        }
        stop = 1;
        for (int i = 0; i <= WORKERS; i++) pthread_join(threads[i], NULL);
        printf("allocations %ld frees %ld captures %ld without-pipe %ld\\n", (long)allocations, (long)frees, captures,
               (long)stallcapture_copies_without_pipe());
        return 0;
    }
    """

/// Three ways a program can leave the SIGPROF handler's sample unfinished, each
/// printed as one line `<case> <numbers>` (built from the package's own C source):
///
/// - `longjmp ok timeouts hung free`: a thread spins while another keeps
///   sending it SIGUSR1, whose handler `siglongjmp`s (a timeout idiom); 5,000
///   captures of it, then how many of the 8 copy pipes are free. A handler
///   interrupted mid-sample by it left its slot and pipe taken, and the next
///   capture waited for good.
/// - `killed result milliseconds`: a thread whose seccomp filter kills it on
///   `fcntl` (a call the handler makes, the thread never) is sampled once.
/// - `readrefused short inexact`: 100 copies of 8 KB on a thread whose filter
///   refuses `read` with EPERM (the pipe's read back fails).
private let unfinishedSampleHarnessSource = """
    #define _GNU_SOURCE
    #include "CStallCapture.h"
    #include "CStallMemoryCopy.h"
    #include <linux/filter.h>
    #include <linux/seccomp.h>
    #include <pthread.h>
    #include <setjmp.h>
    #include <signal.h>
    #include <stddef.h>
    #include <stdio.h>
    #include <string.h>
    #include <sys/prctl.h>
    #include <sys/syscall.h>
    #include <time.h>
    #include <unistd.h>

    static _Atomic pid_t victim_tid;
    static _Atomic int stop, armed;
    static __thread sigjmp_buf back;
    static void jump_out(int signal_number) {
        (void)signal_number;
        if (!armed) return;
        armed = 0;
        siglongjmp(back, 1);
    }
    static void *victim(void *unused) {
        (void)unused;
        sigsetjmp(back, 1);
        victim_tid = (pid_t)syscall(SYS_gettid);
        armed = 1;
        while (!stop) __asm__ volatile("" ::: "memory");
        return NULL;
    }
    static void *pest(void *unused) {
        (void)unused;
        while (!stop) {
            if (armed) syscall(SYS_tgkill, getpid(), victim_tid, SIGUSR1);
            for (volatile int k = 0; k < 300; k++) {}
        }
        return NULL;
    }
    static void *watchdog(void *label) {
        sleep(30);
        printf("%s hung\\n", (const char *)label);
        fflush(stdout);
        _exit(3);
    }
    static int filter(int number, unsigned action) {
        struct sock_filter code[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)number, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, action),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog program = {4, code};
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program);
    }
    static void longjmp_case(void) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = jump_out;
        sigaction(SIGUSR1, &action, NULL);
        pthread_t threads[3];
        pthread_create(&threads[0], NULL, victim, NULL);
        while (!victim_tid) usleep(100);
        pthread_create(&threads[1], NULL, pest, NULL);
        pthread_create(&threads[2], NULL, watchdog, "longjmp");
        static stallcapture_sample sample;
        int error, ok = 0, timeouts = 0;
        for (int index = 0; index < 5000; index++) {
            if (stallcapture_capture(victim_tid, 200, &sample, &error) == 0) ok++; else timeouts++;
        }
        stop = 1;
        pthread_join(threads[0], NULL);
        pthread_join(threads[1], NULL);
        int taken[8], free_pipes = 0;
        for (int index = 0; index < 8; index++) {
            taken[index] = stallcapture_copy_begin();
            if (taken[index] >= 0) free_pipes++;
        }
        for (int index = 0; index < 8; index++) stallcapture_copy_end(taken[index]);
        printf("longjmp %d %d 0 %d\\n", ok, timeouts, free_pipes);
    }
    static _Atomic pid_t doomed_tid;
    static void *doomed(void *unused) {
        (void)unused;
        if (filter(__NR_fcntl, SECCOMP_RET_KILL_THREAD) != 0) return NULL;
        doomed_tid = (pid_t)syscall(SYS_gettid);
        for (;;) __asm__ volatile("" ::: "memory");
    }
    static void killed_case(void) {
        pthread_t thread, guard;
        pthread_create(&guard, NULL, watchdog, "killed");
        pthread_create(&thread, NULL, doomed, NULL);
        while (!doomed_tid) usleep(100);
        static stallcapture_sample sample;
        int error;
        struct timespec start, end;
        clock_gettime(CLOCK_MONOTONIC, &start);
        int result = stallcapture_capture(doomed_tid, 500, &sample, &error);
        clock_gettime(CLOCK_MONOTONIC, &end);
        long elapsed = (end.tv_sec - start.tv_sec) * 1000 + (end.tv_nsec - start.tv_nsec) / 1000000;
        printf("killed %d %ld\\n", result, elapsed);
    }
    static void *refused(void *unused) {
        (void)unused;
        if (filter(__NR_read, SECCOMP_RET_ERRNO | 1) != 0) return NULL;
        static unsigned char source[8192], copy[8192];
        for (int index = 0; index < 8192; index++) source[index] = (unsigned char)(index * 13 + 5);
        int short_copies = 0, inexact = 0, error;
        for (int round = 0; round < 100; round++) {
            memset(copy, 0, sizeof copy);
            size_t copied = stallcapture_copy_memory(copy, (uintptr_t)source, sizeof source, &error);
            if (copied != sizeof source) short_copies++; else if (memcmp(copy, source, sizeof source)) inexact++;
        }
        printf("readrefused %d %d\\n", short_copies, inexact);
        return NULL;
    }
    int main(int argc, char **argv) {
        (void)argc;
        if (stallcapture_install() != 0) return 2;
        pthread_t thread;
        if (!strcmp(argv[1], "longjmp")) longjmp_case();
        if (!strcmp(argv[1], "killed")) killed_case();
        if (!strcmp(argv[1], "readrefused")) { pthread_create(&thread, NULL, refused, NULL); pthread_join(thread, NULL); }
        fflush(stdout);
        _exit(0);
    }
    """

@Suite("The SIGPROF handler is async-signal-safe")
struct SignalHandlerSafetyTests {
    /// The package's directory (three levels above this file).
    static let packageDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    /// The directory of the libdispatch this process runs with.
    static func dispatchDirectory() -> String? {
        guard let dispatch = dlopen(nil, RTLD_NOW), let symbol = dlsym(dispatch, "dispatch_get_current_queue")
        else { return nil }
        var path = [CChar](repeating: 0, count: 4_096)
        var base: UInt = 0
        guard stallcapture_image_of(UInt(bitPattern: symbol), &path, path.count, &base) != 0 else { return nil }
        let name = String(decoding: path.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return URL(fileURLWithPath: name).deletingLastPathComponent().path
    }

    /// Compiles `arguments` with the first C compiler found; whether it built.
    static func compile(_ arguments: [String]) -> Bool {
        for compiler in ["/usr/bin/cc", "/usr/bin/gcc", "/opt/swift/usr/bin/clang"]
        where FileManager.default.isExecutableFile(atPath: compiler) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: compiler)
            process.arguments = arguments
            guard (try? process.run()) != nil else { continue }
            process.waitUntilExit()
            return process.terminationStatus == 0
        }
        return false
    }

    @Test("a signal sample says which queue's job the thread runs, as libdispatch does")
    func sampleNamesTheQueue() throws {
        let spinning = Atomic<Bool>(true)
        let seen = Atomic<UInt>(0)
        let thread = Atomic<Int32>(0)
        // Both alive at once: two addresses.
        let queues = [DispatchQueue(label: "signal-safety.a"), DispatchQueue(label: "signal-safety.b")]
        var addresses: Set<UInt> = []
        for queue in queues {
            spinning.store(true, ordering: .releasing)
            seen.store(0, ordering: .releasing)
            queue.async {
                seen.store(stallcapture_current_queue(), ordering: .releasing)
                thread.store(stallcapture_current_tid(), ordering: .releasing)
                while spinning.load(ordering: .acquiring) {}
            }
            while seen.load(ordering: .acquiring) == 0 { usleep(1_000) }
            let sampler = StackSampler(timeout: .seconds(2))
            var said: [UInt?] = []
            for _ in 0..<5 {
                if case .copied(let copy, signalled: true) = sampler.capture(thread: thread.load(ordering: .acquiring))
                {
                    said.append(copy.queue)
                }
            }
            spinning.store(false, ordering: .releasing)
            queue.sync {}
            let expected = seen.load(ordering: .acquiring)
            addresses.insert(expected)
            print("signal safety: \(queue.label) at \(expected): signalled samples said \(said)")
            #expect(!said.isEmpty, "no signalled sample of the spinning job")
            #expect(said.allSatisfy { $0 == expected }, "\(said) for \(expected)")
        }
        #expect(addresses.count == 2)
    }

    /// Builds `source` with the package's C sources into `directory`; nil when no
    /// C compiler or libdispatch is found.
    static func buildHarness(_ source: String, in directory: URL) throws -> String? {
        let sources = packageDirectory.appendingPathComponent("Sources/CStallCapture")
        let harness = directory.appendingPathComponent("harness").path
        try source.write(toFile: harness + ".c", atomically: true, encoding: .utf8)
        guard let dispatch = dispatchDirectory(),
            compile([
                "-O1", "-I", sources.appendingPathComponent("include").path, "-o", harness, harness + ".c",
                sources.appendingPathComponent("CStallCapture.c").path,
                sources.appendingPathComponent("CStallProcess.c").path,
                sources.appendingPathComponent("CStallMemoryCopy.c").path,
                "-L", dispatch, "-Wl,-rpath," + dispatch, "-ldispatch", "-lpthread", "-ldl",
            ])
        else { return nil }
        return harness
    }

    /// Runs `harness` with `arguments`: its exit status and output.
    static func run(_ harness: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: harness)
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    @Test(
        "a sample left unfinished (a handler that siglongjmps out, a thread killed in the handler, the read back refused): no capture waits for good, no pipe is lost, copies stay exact"
    )
    func unfinishedSamples() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "signal-unfinished-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        guard let harness = try Self.buildHarness(unfinishedSampleHarnessSource, in: directory) else {
            print("signal safety: no C compiler or libdispatch to build the harness with; skipped")
            return
        }
        func numbers(_ text: String) -> [Int] { text.split(separator: " ").dropFirst().compactMap { Int($0) } }
        // Before: 2 of 4 runs waited for good, one pipe left taken.
        let longjmp = try Self.run(harness, ["longjmp"])
        print("signal safety: \(longjmp.output) (status \(longjmp.status))")
        #expect(longjmp.status == 0 && !longjmp.output.contains("hung"), "\(longjmp.output)")
        #expect(numbers(longjmp.output).last == 8, "every pipe free afterwards: \(longjmp.output)")
        // Before: the capture waited for good. Now it gives up once the thread is gone.
        let killed = try Self.run(harness, ["killed"])
        print("signal safety: \(killed.output) (status \(killed.status))")
        let result = numbers(killed.output)
        #expect(killed.status == 0 && !killed.output.contains("hung") && result.count == 2, "\(killed.output)")
        #expect(result.first == Int(STALLCAPTURE_TIMEOUT) && (result.last ?? .max) < 10_000, "\(killed.output)")
        // Before: the first copy through each pipe came back empty (8 of 100).
        let refused = try Self.run(harness, ["readrefused"])
        print("signal safety: \(refused.output) (status \(refused.status))")
        #expect(refused.status == 0 && numbers(refused.output) == [0, 0], "\(refused.output)")
    }

    @Test(
        "the handler allocates and frees nothing, also after a dlopen and dlclose of a library with thread-local storage"
    )
    func noAllocationInHandler() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "signal-safety-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let library = directory.appendingPathComponent("libtls.so").path
        try tlsLibrarySource.write(toFile: library + ".c", atomically: true, encoding: .utf8)
        guard Self.compile(["-shared", "-fPIC", "-O2", "-o", library, library + ".c"]),
            let harness = try Self.buildHarness(handlerHarnessSource, in: directory)
        else {
            print("signal safety: no C compiler or libdispatch to build the harness with; skipped")
            return
        }
        let (status, text) = try Self.run(harness, [library, "3"])
        print("signal safety: \(text) (status \(status))")
        #expect(status == 0)
        let numbers = text.split(whereSeparator: { !$0.isNumber }).compactMap { Int($0) }
        try #require(numbers.count == 4, "\(text)")
        #expect(numbers[0] == 0 && numbers[1] == 0, "the handler allocated or freed memory: \(text)")
        // One capture at a time: each handler finds a copy pipe free.
        #expect(numbers[3] == 0, "the handler copied with process_vm_readv: \(text)")
        // The old handler freed memory about once in six samples here.
        #expect(numbers[2] > 200, "too few samples to judge: \(text)")
    }
}
#endif
