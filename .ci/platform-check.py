#!/usr/bin/env python3
"""Apple platforms keep compiling although no machine here can build for them.

Every Swift file under Sources/, Tests/, Benchmarks/Sources/ and
Examples/*/Sources/, and every C file under Sources/*/ and Benchmarks/Sources/*/,
is read as an Apple build would read it: each `#if` / `#elseif` condition is
evaluated for Darwin (os(), canImport(), arch(), targetEnvironment(),
compiler()/swift(), &&, ||, !, parentheses; for C, defined() and the
platform's macros), for each Apple platform and architecture in turn, and the
code in the branches an Apple build compiles is checked three ways:

1. Names: no symbol, member, type or header that exists only in glibc or Linux
   (string literals and comments are ignored, so names looked up with `dlsym`
   are fine).
2. 32-bit `Int`: watchOS on arm64_32 has a 32-bit `Int`. An integer-literal
   expression whose type is `Int` (the argument of `.seconds(…)`,
   `.milliseconds(…)` and the like, `Int(…)`, an unannotated `let`/`var`, one
   annotated `Int`) must fit it at every step.
3. Darwin shapes: `.ci/darwin-shapes.swift` is a module named `Darwin` that
   re-exports Glibc and declares Darwin's layouts where they differ from
   glibc's (`stat`, `sigaction`, `stack_t`, the `rlimit` and `rusage` calls, a
   few names Darwin lacks or alone has). A memberwise initializer of one of
   those structures anywhere must suit Darwin's members and their order; and
   the files that stand alone (STANDALONE below: they import only the C
   library) are type-checked as macOS and watchOS compile them against that
   module. The per-platform spellings live in such files so that this check
   reaches them.

Needs python3 and, for part 3, the Swift toolchain (skipped with a note when
`swiftc` is missing).
"""
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The package checked: this script's own by default; `--root DIR` checks another
# copy (an older commit, say) with these rules.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if "--root" in sys.argv:
    ROOT = os.path.abspath(sys.argv[sys.argv.index("--root") + 1])
SHAPES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "darwin-shapes.swift")

# ---------------------------------------------------------------------------
# Names

# Declared by glibc (or the Linux headers it exposes) and not by Darwin. An entry
# ending in `_` or `.` is a prefix.
GLIBC_ONLY = [
    # functions
    "gettid", "tgkill", "prctl", "epoll_", "eventfd", "timerfd_", "process_vm_readv", "process_vm_writev",
    "dl_iterate_phdr", "pthread_getattr_np", "pthread_setaffinity_np", "pthread_getaffinity_np",
    "pthread_timedjoin_np", "pthread_tryjoin_np", "sched_getcpu", "sched_setaffinity", "sched_getaffinity",
    "sigtimedwait", "signalfd", "mallinfo", "mallinfo2", "malloc_usable_size", "malloc_trim", "memfd_create",
    "clock_nanosleep", "pipe2", "accept4", "dup3", "getauxval", "ppoll", "syncfs", "fallocate",
    "posix_fadvise", "inotify_", "getrandom", "secure_getenv", "sysinfo", "__errno_location",
    # constants
    "SYS_gettid", "SYS_tgkill", "__NR_", "CLOCK_BOOTTIME", "CLOCK_MONOTONIC_COARSE", "CLOCK_REALTIME_COARSE",
    "TIMER_ABSTIME", "PR_SET_TIMERSLACK", "PR_SET_NAME", "MSG_NOSIGNAL", "O_PATH", "O_TMPFILE",
    "AT_EMPTY_PATH", "MAP_POPULATE", "SOCK_CLOEXEC", "SOCK_NONBLOCK", "AT_HWCAP", "REG_RIP", "REG_RSP",
    "REG_RBP",
    # types and members whose names differ on Darwin
    "dl_phdr_info", "ElfW", "Elf64_", "Elf32_", "linux_dirent", "cpu_set_t", "sighandler_t",
    "__sigaction_handler",  # Darwin: __sigaction_u.__sa_handler
    "st_mtim", "st_atim", "st_ctim",  # Darwin: st_mtimespec, st_atimespec, st_ctimespec
    # modules
    "Glibc.", "Musl.",
]


def names_pattern(names):
    parts = []
    for name in names:
        tail = "" if name.endswith(("_", ".")) else r"(?![A-Za-z0-9_])"
        parts.append(re.escape(name) + tail)
    return re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(parts) + ")")


SWIFT_NAMES = names_pattern(GLIBC_ONLY)
# glibc's own typedefs (`__rlimit_resource_t`, `__rusage_who_t`, `__pid_t`):
# Darwin's are `__darwin_…`; `.rawValue` of a constant that glibc imports as an
# enum and Darwin as a plain integer; `pthread_t()` (Darwin's `pthread_t` is a
# pointer, with no empty initializer); glibc's two-argument `pthread_setname_np`
# (Darwin's names the calling thread only).
SWIFT_EXTRA = re.compile(
    r"(?<![A-Za-z0-9_])(__(?!darwin_)[a-z][a-z0-9_]*_t(?![A-Za-z0-9_])"
    r"|(?:RLIMIT|RUSAGE|PRIO|ITIMER|SOCK|IPPROTO)_[A-Z0-9_]+\.rawValue"
    r"|pthread_t\(\s*\)|pthread_setname_np\(\s*pthread_self\(\)\s*,)")
# Headers that Darwin does not have (or that stop a build there: `ucontext.h`
# without `_XOPEN_SOURCE` is an #error).
LINUX_HEADERS = re.compile(
    r"#\s*include\s*<((linux|asm|gnu)/[^>]+|sys/(epoll|eventfd|auxv|prctl|sysinfo|timerfd|signalfd|inotify|"
    r"sysmacros)\.h|malloc\.h|features\.h|ucontext\.h|elf\.h|link\.h)>")


# ---------------------------------------------------------------------------
# Darwin configurations: what an Apple build sees.

APPLE_OSES = ["macOS", "iOS", "tvOS", "watchOS", "visionOS"]
APPLE_ARCHES = {"macOS": ["arm64", "x86_64"], "watchOS": ["arm64_32", "arm64"]}
# Modules an Apple build cannot import; every other module is assumed there.
NOT_ON_DARWIN = {"Glibc", "Musl", "Bionic", "Android", "WinSDK", "WASILibc", "CRT", "ucrt"}
# C macros an Apple toolchain defines, per architecture.
C_ARCH_MACROS = {
    "arm64": {"__aarch64__", "__arm64__", "__LP64__"},
    "x86_64": {"__x86_64__", "__LP64__"},
    "arm64_32": {"__arm64__", "__ARM64_ARCH_8_32__", "__ILP32__"},
}
C_MACROS = {"__APPLE__", "__MACH__", "__clang__", "__STDC__"}


def configurations(text=""):
    """The Apple configurations whose differences `text`'s conditions can see
    (all of them for an empty text)."""
    arches = not text or re.search(r"arch\(|_pointerBitWidth|__(aarch64|arm64|x86_64|LP64|ILP32)", text)
    simulators = not text or "targetEnvironment" in text
    for os_name in APPLE_OSES:
        for arch in APPLE_ARCHES.get(os_name, ["arm64"]) if arches else ["arm64"]:
            for simulator in (False, True) if os_name != "macOS" and simulators else (False,):
                for flags in (False, True):
                    yield {"os": os_name, "arch": arch, "simulator": simulator, "flags": flags}


class ConditionError(Exception):
    pass


def tokenize(text, c_language):
    pattern = (
        r"\s*(&&|\|\||!=|==|>=|<=|[()!<>]|[A-Za-z_][A-Za-z0-9_]*|0[xX][0-9a-fA-F]+[uUlL]*|\d+[uUlL]*|,)"
        if c_language else
        r"\s*(&&|\|\||>=|<=|[()!<>,]|[A-Za-z_][A-Za-z0-9_.]*|\d+(?:\.\d+)*)")
    tokens, position = [], 0
    text = text.strip()
    while position < len(text):
        match = re.compile(pattern).match(text, position)
        if not match or match.end() == position:
            raise ConditionError(f"cannot read condition {text!r}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


class Evaluator:
    """A recursive-descent evaluator of `#if` conditions (Swift or C) for one
    Darwin configuration."""

    def __init__(self, config, c_language=False, defined=frozenset()):
        self.config = config
        self.c_language = c_language
        self.defined = defined

    def evaluate(self, text):
        self.tokens = tokenize(text, self.c_language)
        self.position = 0
        value = self.disjunction()
        if self.position != len(self.tokens):
            raise ConditionError(f"unexpected {self.tokens[self.position]!r} in {text!r}")
        return bool(value)

    def peek(self):
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected=None):
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ConditionError(f"expected {expected or 'more'} in {' '.join(self.tokens)!r}")
        self.position += 1
        return token

    def disjunction(self):
        value = self.conjunction()
        while self.peek() == "||":
            self.take()
            right = self.conjunction()
            value = value or right
        return value

    def conjunction(self):
        value = self.comparison()
        while self.peek() == "&&":
            self.take()
            right = self.comparison()
            value = value and right
        return value

    def comparison(self):
        value = self.unary()
        while self.c_language and self.peek() in ("==", "!=", ">=", "<=", ">", "<"):
            operator, right = self.take(), self.unary()
            value = {"==": value == right, "!=": value != right, ">=": value >= right, "<=": value <= right,
                     ">": value > right, "<": value < right}[operator]
        return value

    def unary(self):
        if self.peek() == "!":
            self.take()
            return not self.unary()
        if self.peek() == "(":
            self.take()
            value = self.disjunction()
            self.take(")")
            return value
        return self.c_primary() if self.c_language else self.swift_primary()

    def argument(self):
        """The text inside the parentheses after a function-like condition."""
        self.take("(")
        depth, parts = 1, []
        while True:
            token = self.take()
            depth += {"(": 1, ")": -1}.get(token, 0)
            if depth == 0:
                return " ".join(parts)
            parts.append(token)

    def swift_primary(self):
        name = self.take()
        config = self.config
        if self.peek() != "(":
            return {"true": True, "false": False}.get(name, config["flags"])  # a -D flag: both ways
        argument = self.argument()
        if name == "os":
            return argument == config["os"]
        if name == "arch":
            return argument == config["arch"]
        if name == "canImport":
            return argument.split(",")[0].strip() not in NOT_ON_DARWIN
        if name == "targetEnvironment":
            return argument == "simulator" and config["simulator"] or argument == "macCatalyst" and config["flags"]
        if name in ("compiler", "swift", "hasFeature", "hasAttribute"):
            return True
        if name == "_endian":
            return argument == "little"
        if name == "_pointerBitWidth":
            return argument == ("_32" if config["arch"] == "arm64_32" else "_64")
        if name in ("_runtime",):
            return argument == "_ObjC"
        raise ConditionError(f"unknown condition {name}(…)")

    def c_primary(self):
        token = self.take()
        if token == "defined":
            name = self.argument() if self.peek() == "(" else self.take()
            return self.is_defined(name.strip())
        if re.match(r"\d|0[xX]", token):
            return int(re.sub(r"[uUlL]+$", "", token), 0)
        if self.peek() == "(":  # a function-like macro (__has_include, __has_feature): assume yes
            self.argument()
            return 1
        return 1 if self.is_defined(token) else 0

    def is_defined(self, name):
        return name in C_MACROS or name in C_ARCH_MACROS[self.config["arch"]] or name in self.defined


# ---------------------------------------------------------------------------
# Reading a file as Darwin does


SWIFT_SKIPPED = re.compile(r'//[^\n]*|/\*|"""(?:\\.|[^\\])*?"""|"(?:\\.|[^"\\\n])*"', re.S)


def strip_swift(text):
    """The Swift source with comments and string literals blanked (newlines
    kept, so line numbers stay)."""
    out, position = [], 0
    for match in iter(lambda: SWIFT_SKIPPED.search(text, position), None):
        start, end = match.start(), match.end()
        if match.group(0) == "/*":  # block comments nest in Swift
            depth = 1
            while end < len(text) and depth:
                step = text[end:end + 2]
                depth += 1 if step == "/*" else -1 if step == "*/" else 0
                end += 2 if step in ("/*", "*/") else 1
        blank = re.sub(r"[^\n]", " ", text[start:end])
        if text[start] == '"':
            blank = '"' + blank[1:-1] + '"'
        out += [text[position:start], blank]
        position = end
    out.append(text[position:])
    return "".join(out)


def strip_c(text):
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


def active_lines(lines, config, c_language):
    """Which lines (0-based) a build for `config` compiles; raises
    ConditionError for a condition it cannot read."""
    directive = re.compile(r"\s*#\s*(if|ifdef|ifndef|elseif|elif|else|endif|define)\b(.*)")
    defined = set()
    stack = []  # per open #if: [this branch taken, a branch already taken, enclosing active]
    active = set()
    for number, line in enumerate(lines):
        match = directive.match(line)
        enclosing = all(frame[0] for frame in stack)
        if match:
            keyword, rest = match.group(1), match.group(2).strip()
            evaluator = Evaluator(config, c_language, frozenset(defined))
            if keyword == "define" and c_language:
                if enclosing and rest:
                    defined.add(re.match(r"[A-Za-z_][A-Za-z0-9_]*", rest).group(0))
                continue
            if keyword in ("if", "ifdef", "ifndef"):
                if keyword == "if":
                    value = evaluator.evaluate(rest)
                else:
                    value = evaluator.is_defined(rest.split()[0]) == (keyword == "ifdef")
                stack.append([value, value])
            elif keyword in ("elseif", "elif"):
                value = not stack[-1][1] and evaluator.evaluate(rest)
                stack[-1] = [value, stack[-1][1] or value]
            elif keyword == "else":
                stack[-1] = [not stack[-1][1], True]
            elif keyword == "endif":
                stack.pop()
            continue
        if enclosing:
            active.add(number)
    return active


def darwin_lines(text, c_language):
    """The lines any Apple configuration compiles; `text` without comments."""
    lines = text.split("\n")
    if not re.search(r"^\s*#\s*(if|ifdef|ifndef)\b", text, flags=re.M):
        return set(range(len(lines)))
    conditions = "\n".join(line for line in lines if re.match(r"\s*#\s*(if|elseif|elif)\b", line))
    active = set()
    for config in configurations(conditions):
        active |= active_lines(lines, config, c_language)
    return active


def darwin_view(text, config):
    """The file as `config` compiles it: inactive lines and directives blanked."""
    lines = text.split("\n")
    active = active_lines(strip_swift(text).split("\n"), config, False)
    return "\n".join(line if number in active else "" for number, line in enumerate(lines))


# ---------------------------------------------------------------------------
# 32-bit Int

INT32 = (-(1 << 31), (1 << 31) - 1)
LITERAL_EXPRESSION = re.compile(r"[\s()+\-*/%<>&|^~]*(0[xob])?[0-9][0-9a-fA-F_xob\s()+\-*/%<>&|^~]*")
INT_CONTEXTS = [
    # Duration's generic integer factories: a literal argument is an Int.
    re.compile(r"\.(?:seconds|milliseconds|microseconds|nanoseconds)\("),
    re.compile(r"(?<![A-Za-z0-9_.])Int\("),
    # `let x = …` (inferred Int) and `x: Int = …` (a property, a variable, a default argument).
    re.compile(r"(?:\b(?:let|var)\s+[A-Za-z_][A-Za-z0-9_]*|:\s*Int)\s*=\s*()"),
]


def int_expressions(line):
    """The Int-typed integer-literal expressions on a stripped line."""
    found = []
    for context in INT_CONTEXTS:
        for match in context.finditer(line):
            # The argument, or the initial value up to the end of its statement
            # or argument list (`… as UInt64` is then no literal expression).
            start = end = match.end()
            depth = 0
            while end < len(line) and not (depth == 0 and line[end] in ",;{})"):
                depth += {"(": 1, ")": -1}.get(line[end], 0)
                end += 1
            text = line[start:end]
            if text.strip() and LITERAL_EXPRESSION.fullmatch(text) and re.search(r"\d", text):
                found.append(text.strip())
    return found


BINARY = {
    ast.Add: ("+", lambda a, b: a + b), ast.Sub: ("-", lambda a, b: a - b), ast.Mult: ("*", lambda a, b: a * b),
    ast.FloorDiv: ("/", lambda a, b: int(a / b) if b else 0), ast.Mod: ("%", lambda a, b: a % b if b else 0),
    ast.LShift: ("<<", lambda a, b: a << b), ast.RShift: (">>", lambda a, b: a >> b),
    ast.BitAnd: ("&", lambda a, b: a & b), ast.BitOr: ("|", lambda a, b: a | b),
    ast.BitXor: ("^", lambda a, b: a ^ b),
}
UNARY = {ast.USub: lambda a: -a, ast.UAdd: lambda a: a, ast.Invert: lambda a: ~a}


def check_int32(expression):
    """None when `expression` and every step of it fit Int32, else the first
    step (or literal) that does not."""
    python = re.sub(r"(?<=[0-9a-fA-F])_(?=[0-9a-fA-F])", "", expression).replace("/", "//")
    try:
        tree = ast.parse(python, mode="eval").body
    except SyntaxError:
        return None
    too_wide = []

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            result, text = node.value, f"{node.value:,}"
        elif isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            result, text = UNARY[type(node.op)](value(node.operand)), None
        elif isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            left, right = value(node.left), value(node.right)
            symbol, operation = BINARY[type(node.op)]
            result, text = operation(left, right), f"{left:,} {symbol} {right:,}"
        else:
            raise ValueError(node)
        if not INT32[0] <= result <= INT32[1] and not too_wide:
            too_wide.append(text or f"{result:,}")
        return result

    try:
        value(tree)
    except (ValueError, OverflowError):
        return None
    return too_wide[0] if too_wide else None


# ---------------------------------------------------------------------------
# Checking files


def shaped_structs():
    """The structures of `.ci/darwin-shapes.swift`, each with its members in
    Darwin's order."""
    text = open(SHAPES, encoding="utf-8").read()
    return {match.group(1): re.findall(r"^    public var (\w+)", match.group(2), flags=re.M)
            for match in re.finditer(r"^public struct (\w+) \{\n(.*?)^\}", text, flags=re.S | re.M)}


STRUCTS = shaped_structs()
MEMBERWISE = re.compile(r"(?<![A-Za-z0-9_.])(" + "|".join(map(re.escape, STRUCTS)) + r")\(")


def memberwise_problem(line):
    """A memberwise initializer of a structure whose Darwin members differ (a
    member it lacks, or another order), as Darwin would reject it."""
    for match in MEMBERWISE.finditer(line):
        depth, end, outer = 1, match.end(), []
        while end < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[end], 0)
            if depth == 1 and line[end] not in "()":
                outer.append(line[end])
            end += 1
        labels = re.findall(r"(?:^|,)\s*([A-Za-z_][A-Za-z0-9_]*)\s*:", "".join(outer))
        members = STRUCTS[match.group(1)]
        name = f"{match.group(1)}({''.join(label + ':' for label in labels)})"
        if any(label not in members for label in labels):
            return f"`{name}`: Darwin's {match.group(1)} has the members {', '.join(members)}"
        if labels != sorted(labels, key=members.index):
            return f"`{name}`: Darwin's {match.group(1)} has its members in the order {', '.join(members)}"
    return None



def check_swift(path, relative):
    text = open(path, encoding="utf-8").read()
    stripped = strip_swift(text)
    try:
        active = darwin_lines(stripped, c_language=False)
    except ConditionError as error:
        return [f"{relative}: {error}: teach .ci/platform-check.py this condition"]
    stripped = stripped.split("\n")
    problems = []
    for number in sorted(active):
        line = stripped[number]
        match = SWIFT_NAMES.search(line) or SWIFT_EXTRA.search(line)
        if match:
            problems.append(f"{relative}:{number + 1}: '{match.group(1)}' is glibc-only, and an Apple build "
                            f"compiles this line: put it in a Linux branch and give Darwin its own")
        shape = memberwise_problem(line)
        if shape:
            problems.append(f"{relative}:{number + 1}: {shape} (.ci/darwin-shapes.swift): build it member by member")
        for expression in int_expressions(line):
            step = check_int32(expression)
            if step:
                problems.append(f"{relative}:{number + 1}: `{expression}` is an Int, and {step} does not fit the "
                                f"32-bit Int of watchOS (arm64_32): give it a wider type or a smaller literal")
    return problems


def check_c(path, relative):
    text = open(path, encoding="utf-8").read()
    stripped = strip_c(text)
    try:
        active = darwin_lines(stripped, c_language=True)
    except ConditionError as error:
        return [f"{relative}: {error}: teach .ci/platform-check.py this condition"]
    raw, stripped = text.split("\n"), stripped.split("\n")
    problems = []
    for number in sorted(active):
        match = LINUX_HEADERS.search(raw[number]) or SWIFT_NAMES.search(stripped[number])
        if match:
            problems.append(f"{relative}:{number + 1}: '{match.group(1)}' is Linux-only, and an Apple build "
                            f"compiles this line: guard it with #if defined(__linux__) and give Darwin its own")
    return problems


def source_files():
    roots = ["Sources", "Tests", os.path.join("Benchmarks", "Sources")]
    examples = os.path.join(ROOT, "Examples")
    if os.path.isdir(examples):
        roots += [os.path.join("Examples", name, "Sources") for name in sorted(os.listdir(examples))]
    for root in roots:
        for folder, folders, files in os.walk(os.path.join(ROOT, root)):
            folders[:] = sorted(name for name in folders if not name.startswith("."))
            for name in sorted(files):
                yield os.path.join(folder, name)


# ---------------------------------------------------------------------------
# Darwin shapes


# Groups of files that stand alone (they import only the C library and
# Synchronization, and use nothing else of their module): the per-platform
# spellings live in them, and each group is type-checked as Darwin compiles it
# against `.ci/darwin-shapes.swift`. A new file of that kind belongs here.
STANDALONE = [
    ["Sources/SafeTimers/Scheduling/ConditionLock.swift", "Sources/SafeTimers/Scheduling/MonotonicClock.swift",
     "Sources/SafeTimers/Scheduling/NamedThread.swift", "Sources/SafeTimers/Scheduling/ThreadIdentity.swift"],
    ["Sources/StallDetection/Platform/FileStatus.swift"],
    ["Sources/StallDetection/Platform/ProcFile.swift"],
    ["Sources/stall-probe/Platform.swift"],
]


def swiftc(arguments, work):
    result = subprocess.run([SWIFTC, "-package-name", "SafeTimers"] + arguments, cwd=work, capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


DARWIN_TARGETS = ({"os": "macOS", "arch": "arm64", "simulator": False, "flags": False},
                  {"os": "watchOS", "arch": "arm64_32", "simulator": False, "flags": False})


def check_darwin_views(group, work):
    """The files of `group` type-checked together as macOS and watchOS compile
    them (watchOS only when it reads them differently), against the shapes. A
    file that stops standing alone fails here too (a name of its module not
    found)."""
    texts = {relative: open(os.path.join(ROOT, relative), encoding="utf-8").read() for relative in group}
    seen = set()
    for config in DARWIN_TARGETS:
        views = {relative: darwin_view(text, config) for relative, text in texts.items()}
        if tuple(views.values()) in seen:
            continue
        seen.add(tuple(views.values()))
        paths = {}
        for index, (relative, view) in enumerate(views.items()):
            paths[relative] = os.path.join(work, f"{index}-{os.path.basename(relative)}")
            open(paths[relative], "w").write(view)
        code, output = swiftc(["-typecheck", "-parse-as-library", "-I", work] + list(paths.values()), work)
        if code != 0:
            errors = [line for line in output.split("\n") if ": error:" in line] or [output]
            for relative, path in paths.items():
                errors = [error.replace(path, relative) for error in errors]
            return [f"{error} (as {config['os']} on {config['arch']} compiles it, against .ci/darwin-shapes.swift)"
                    for error in errors]
    return []


def check_shapes():
    if SWIFTC is None:
        print("platform check: swiftc not found, Darwin shapes not checked")
        return []
    problems = []
    with tempfile.TemporaryDirectory() as work:
        code, output = swiftc(["-parse-as-library", "-module-name", "Darwin", "-emit-module", "-emit-module-path",
                               os.path.join(work, "Darwin.swiftmodule"), SHAPES], work)
        if code != 0:
            return [f".ci/darwin-shapes.swift does not compile:\n{output}"]
        # An older tree (checked with --root) may not have the files yet.
        groups = [[relative for relative in group if os.path.exists(os.path.join(ROOT, relative))]
                  for group in STANDALONE]
        groups = [group for group in groups if group]
        for group in groups:
            problems += check_darwin_views(group, work)
        count = sum(map(len, groups))
        print(f"platform check: {count} standalone files type-checked as Darwin compiles them")
    return problems


SWIFTC = shutil.which("swiftc") or (os.path.exists("/opt/swift/usr/bin/swiftc") and "/opt/swift/usr/bin/swiftc")


def main():
    paths = list(source_files())
    problems = []
    for path in paths:
        relative = os.path.relpath(path, ROOT)
        if path.endswith(".swift"):
            problems += check_swift(path, relative)
        elif path.endswith((".c", ".h")):
            problems += check_c(path, relative)
    if "--no-shapes" not in sys.argv:
        problems += check_shapes()
    for problem in problems:
        print(problem)
    print(f"platform check: {len(paths)} files read as Apple builds read them, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
