#!/usr/bin/env python3
"""The one-way data flow of src/ (DESIGN.md section 2; issue 28): every src/*.c file's includes
of src/ headers and its uses of internal names (sdpa__*) defined in another src/*.c file are
arrows from that file to the other; the stage order written in the comment at the top of
src/internal.h ("Stages, top to bottom") ranks every file. Fails on an arrow up (to an earlier
stage), on an arrow between two files of one stage that makes a circle, and on a src/*.c file
that the order does not name.

    check_layering.py [SRC_DIR]        (default: the src/ next to tests/)
    check_layering.py --graph [SRC]    print the arrows
"""
import os
import re
import sys


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


def read_stages(src):
    """[(stage name, [files])] from internal.h's comment, top stage first."""
    text = open(os.path.join(src, "internal.h")).read()
    m = re.search(r"Stages, top to bottom.*?:\n(.*?)\n \*\n", text, flags=re.S)
    if not m:
        sys.exit("check_layering: no 'Stages, top to bottom' list at the top of src/internal.h")
    stages = []
    for line in m.group(1).split("\n"):
        line = line.lstrip(" *")
        if not line:
            continue
        name, _, files = line.partition(":")
        stages.append((name.strip(), re.findall(r"[\w.*]+\.c\b|[\w]+_\*\.c", files)))
    return stages


def rank_of(stages, files):
    rank = {}
    for i, (_, pats) in enumerate(stages):
        for pat in pats:
            rx = re.compile("^" + re.escape(pat).replace(r"\*", ".*") + "$")
            for f in files:
                if rx.match(f) and f not in rank:
                    rank[f] = i
    return rank


def definitions(src, files):
    """internal name -> the .c file that defines it (functions and objects at file scope)."""
    owner = {}
    for f in files:
        text = strip_comments(open(os.path.join(src, f)).read())
        for m in re.finditer(r"^(?!static\b)(?:[A-Za-z_][\w \t\*]*?)\b(sdpa__\w+)\s*(\(|=|\[)", text, flags=re.M):
            owner.setdefault(m.group(1), f)
    return owner


def interfaces(src):
    """The interface headers internal.h names (no arrow by being included)."""
    text = open(os.path.join(src, "internal.h")).read()
    m = re.search(r"Interface headers.*?:(.*?)\*/", text, flags=re.S)
    return set(re.findall(r"\w+\.h", m.group(1))) if m else set()


def header_owner(src, files):
    """src/ header -> the .c file of the same name, except for interface headers (implemented by
    several files: an arrow only through the names a file uses)."""
    own = {}
    skip = interfaces(src)
    for h in os.listdir(src):
        if h.endswith(".h") and h != "internal.h" and h not in skip and h[:-2] + ".c" in files:
            own[h] = [h[:-2] + ".c"]
    return own


def arrows(src):
    files = sorted(f for f in os.listdir(src) if f.endswith(".c"))
    owner = definitions(src, files)
    hown = header_owner(src, files)
    edges = {}
    for f in files:
        raw = open(os.path.join(src, f)).read()
        text = strip_comments(raw)
        out = edges.setdefault(f, {})
        for h in re.findall(r'#include\s+"(\w+\.h)"', raw):
            for g in hown.get(h, []):
                if g != f:
                    out.setdefault(g, "includes " + h)
        for name in set(re.findall(r"\bsdpa__\w+", text)):
            g = owner.get(name)
            if g is not None and g != f:
                out.setdefault(g, "uses " + name)
    return files, edges


def main(argv):
    graph = "--graph" in argv
    args = [a for a in argv if a != "--graph"]
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
    stages = read_stages(src)
    files, edges = arrows(src)
    rank = rank_of(stages, files)
    bad = []
    for f in files:
        if f not in rank:
            bad.append(f"{f}: not in the stage order of src/internal.h")
    for f in files:
        for g, why in sorted(edges[f].items()):
            if graph:
                print(f"{f} -> {g} ({why})")
            if f in rank and g in rank and rank[g] < rank[f]:
                bad.append(f"arrow up: {f} ({stages[rank[f]][0]}) -> {g} ({stages[rank[g]][0]}): {why}")
    # circles (within a stage; across stages an arrow up is reported above)
    state = {}

    def visit(f, path):
        state[f] = 1
        for g in sorted(edges.get(f, {})):
            if state.get(g) == 1:
                cyc = path[path.index(g):] + [g]
                bad.append("circle: " + " -> ".join(cyc))
            elif state.get(g) is None:
                visit(g, path + [g])
        state[f] = 2

    for f in files:
        if state.get(f) is None:
            visit(f, [f])
    for b in bad:
        print("check_layering:", b)
    if not bad:
        print(f"check_layering: {len(files)} files, {sum(len(e) for e in edges.values())} arrows, "
              f"{len(stages)} stages: no arrow up, no circle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
