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

    @Test(
        "the handler allocates and frees nothing, also after a dlopen and dlclose of a library with thread-local storage"
    )
    func noAllocationInHandler() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "signal-safety-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let sources = Self.packageDirectory.appendingPathComponent("Sources/CStallCapture")
        let library = directory.appendingPathComponent("libtls.so").path
        let harness = directory.appendingPathComponent("harness").path
        try tlsLibrarySource.write(toFile: library + ".c", atomically: true, encoding: .utf8)
        try handlerHarnessSource.write(toFile: harness + ".c", atomically: true, encoding: .utf8)
        guard let dispatch = Self.dispatchDirectory(),
            Self.compile(["-shared", "-fPIC", "-O2", "-o", library, library + ".c"]),
            Self.compile([
                "-O1", "-I", sources.appendingPathComponent("include").path, "-o", harness, harness + ".c",
                sources.appendingPathComponent("CStallCapture.c").path,
                sources.appendingPathComponent("CStallProcess.c").path,
                sources.appendingPathComponent("CStallMemoryCopy.c").path,
                "-L", dispatch, "-Wl,-rpath," + dispatch, "-ldispatch", "-lpthread", "-ldl",
            ])
        else {
            print("signal safety: no C compiler or libdispatch to build the harness with; skipped")
            return
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: harness)
        process.arguments = [library, "3"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let summary = text.trimmingCharacters(in: .whitespacesAndNewlines)
        print("signal safety: \(summary) (status \(process.terminationStatus))")
        #expect(process.terminationStatus == 0)
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
