#!/usr/bin/env python3
"""engine-graph.py - the engine's include and call graph, read from its sources.

Usage: scripts/engine-graph.py [DIR ...]   (default: src/engine)
       scripts/engine-graph.py --dot       (the file call graph in Graphviz form)

What it counts, with comments and strings stripped:
  - the size of every file, the largest first, and of internal.h;
  - the functions defined in one file of DIR and called from another
    (a "shared" function), and the links they make between files;
  - the file call graph's strongly connected components (each is a cycle:
    files that call each other, directly or round a loop);
  - the two-way pairs (a calls b and b calls a);
  - for each file, how many other files it calls into.

A function is attributed to the file that defines it (a body follows its
declaration). A call is a name followed by "(" that some other file of DIR
defines. It reads C as text, not as a compiler would: good enough to count
calls between files of one directory, which name each other explicitly.
"""
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined",
            "_Static_assert", "static_assert", "alignof", "_Alignof"}


def strip(text):
    """Removes comments, string and character literals, keeping newlines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def definitions(code):
    """Names of the functions this file defines (non-static or static)."""
    names = {}
    depth = 0
    # A definition: at brace depth 0, NAME ( ... ) { . Walk the text,
    # tracking depth, and look back from each top-level "{".
    i = 0
    for m in re.finditer(r"[{}]", code):
        if m.group() == "{":
            if depth == 0:
                head = code[i:m.start()]
                hm = re.search(r"(" + IDENT + r")\s*\(([^()]|\([^()]*\))*\)\s*$",
                               head)
                if hm and hm.group(1) not in KEYWORDS:
                    static = re.search(r"\bstatic\b[^;{}]*$", head) is not None
                    names[hm.group(1)] = static
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                i = m.end()
        if depth == 0 and m.group() == "}":
            i = m.end()
    return names


def bodies(code):
    """The text inside braces (function bodies and initialisers), so that
    a prototype is not taken for a call."""
    out, depth = [], 0
    for ch in code:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        out.append(ch if depth > 0 or ch == "\n" else " ")
    return "".join(out)


def main(argv):
    dot = "--dot" in argv
    dirs = [a for a in argv if not a.startswith("--")] or ["src/engine"]
    files = {}
    for d in dirs:
        for f in sorted(os.listdir(d)):
            if f.endswith((".c", ".h")):
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    files[f] = fh.read()
    code = {f: strip(t) for f, t in files.items()}
    defs = {}  # name -> file (non-static only)
    for f, c in code.items():
        if f.endswith(".c"):
            for name, static in definitions(c).items():
                if not static:
                    defs[name] = f
        else:  # static inline functions in headers count for the header
            for name in re.findall(r"static\s+inline\s+[^;{()]*?\b(" + IDENT +
                                   r")\s*\(", c):
                defs[name] = f
    calls = {f: {} for f in code}  # file -> callee file -> set of names
    shared = set()
    for f, c in code.items():
        for m in re.finditer(r"\b(" + IDENT + r")\s*\(", bodies(c)):
            name = m.group(1)
            g = defs.get(name)
            if g and g != f:
                calls[f].setdefault(g, set()).add(name)
                shared.add(name)
    includes = {f: sorted(set(re.findall(r'#include\s+"([^"/]+)"', files[f])) &
                          set(files)) for f in files}
    if dot:
        print("digraph engine {")
        for f in sorted(calls):
            for g in sorted(calls[f]):
                print(f'  "{f}" -> "{g}" [label={len(calls[f][g])}];')
        print("}")
        return 0

    # Strongly connected components (Tarjan), over .c files' call edges.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in calls[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(calls):
        if v not in index:
            visit(v)

    lines = {f: t.count("\n") for f, t in files.items()}
    links = sum(len(v) for v in calls.values())
    pairs = sorted({tuple(sorted((f, g))) for f in calls for g in calls[f]
                    if f in calls.get(g, {})})
    print(f"files: {len(files)}, lines: {sum(lines.values())}")
    big = sorted(lines.items(), key=lambda kv: -kv[1])[:5]
    print("largest: " + ", ".join(f"{f} {n}" for f, n in big))
    if "internal.h" in lines:
        decls = len(re.findall(r"^\w[^;{}()]*\b(pr__\w+)\s*\(", code["internal.h"],
                               re.M))
        print(f"internal.h: {lines['internal.h']} lines, "
              f"{decls} function declarations")
    print(f"functions defined in one file and called from another: {len(shared)}")
    print(f"links between files (caller file -> callee file): {links}")
    print(f"cycles (strongly connected components): {len(sccs)}")
    for comp in sccs:
        print(f"  {len(comp)} files: {' '.join(comp)}")
    print(f"two-way pairs: {len(pairs)}")
    for a, b in pairs:
        print(f"  {a} <-> {b}: {', '.join(sorted(calls[a][b]))} / "
              f"{', '.join(sorted(calls[b][a]))}")
    print("fan-out (files each file calls into):")
    for f in sorted(calls, key=lambda f: (-len(calls[f]), f)):
        if calls[f]:
            print(f"  {f}: {len(calls[f])}: {' '.join(sorted(calls[f]))}")
    print("includes (within the directory):")
    for f in sorted(includes):
        if includes[f]:
            print(f"  {f}: {' '.join(includes[f])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
