#!/usr/bin/env python3
"""Compiles every Swift code example in the DocC comments and articles of the
given modules, so that documentation cannot drift from the API.

Each example becomes the body of its own async throwing function in a generated
test target (Tests/DocExamples, removed afterwards), built against the package
with a small prelude that declares the free names examples use (`refresh()`,
`log`, ...). A block that declares types or `@Test` functions is emitted at file
scope inside its own `enum` namespace instead. Usage: doc-examples.py MODULE...
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks_in_swift(path):
    """Yields (line, code) for each ```swift block in /// comments."""
    lines = open(path, encoding="utf-8").read().split("\n")
    inside, start, body = False, 0, []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped.startswith("///"):
            inside = False
            continue
        text = stripped[3:]
        if text.startswith(" "):
            text = text[1:]
        if text.startswith("```"):
            if inside:
                yield start, "\n".join(body)
                inside = False
            elif text.strip() == "```swift":
                inside, start, body = True, number, []
            continue
        if inside:
            body.append(text)


def blocks_in_markdown(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    inside, start, body = False, 0, []
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            if inside:
                yield start, "\n".join(body)
                inside = False
            elif line.strip() == "```swift":
                inside, start, body = True, number, []
            continue
        if inside:
            body.append(line)


DECLARATION = re.compile(r"^(@MainActor\s+)?(public\s+)?(final\s+class|class|struct|enum|actor|extension|@Test|@Suite)\b")


def main(modules):
    examples = []
    for module in modules:
        for folder, _, files in os.walk(os.path.join(ROOT, "Sources", module)):
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.endswith(".swift"):
                    found = blocks_in_swift(path)
                elif name.endswith(".md"):
                    found = blocks_in_markdown(path)
                else:
                    continue
                for line, code in found:
                    if "// not compiled" in code:
                        continue
                    code = "\n".join(l for l in code.split("\n") if not l.startswith("import "))
                    examples.append((os.path.relpath(path, ROOT), line, code))
    out = [
        "import Dispatch", "import Foundation", "import Logging", "import ServiceLifecycle", "import Synchronization",
        "import Testing", "import Tracing",
        *[f"import {module}" for module in modules], "",
    ]
    for index, (path, line, code) in enumerate(examples):
        out.append(f"// {path}:{line}")
        has_declarations = any(DECLARATION.match(l) for l in code.split("\n"))
        if has_declarations:
            out.append(f"struct Example{index} {{")
            out.append(code)
            out.append("}")
        else:
            out.append(f"@MainActor func example{index}() async throws {{")
            out.append(code)
            out.append("}")
        out.append("")
    print("\n".join(out))
    print(f"// {len(examples)} examples", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
