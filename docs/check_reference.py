#!/usr/bin/env python3
"""Check that the generated API reference lists every public symbol of sdpa.h, documented.

    check_reference.py include/sdpa.h build/docs/xml

Public symbols, read from the header's text: every SDPA_API function and every static inline
function, every enum value, every typedef, every SDPA_* macro (not the include guard SDPA_H).
The file must have its @file block (else Doxygen leaves the whole file out of the HTML).
Each must be a member of the file's page in Doxygen's XML (sdpa_8h.xml) with a non-empty
description; a missing or undocumented one fails the test, by name.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def header_symbols(path):
    with open(path, encoding="utf-8") as f:
        code = strip_comments(f.read())
    sym = {}
    for name in re.findall(r"^\s*#\s*define\s+(SDPA_\w+)", code, flags=re.M):
        if name != "SDPA_H":
            sym[name] = "macro"
    # declarations: join the lines, drop preprocessor lines
    decl = "\n".join(l for l in code.splitlines() if not l.lstrip().startswith("#"))
    for m in re.finditer(r"\bSDPA_API\b[^;{}()]*?\b(sdpa_\w+)\s*\(", decl):
        sym[m.group(1)] = "function (SDPA_API)"
    for m in re.finditer(r"\bstatic\s+inline\b[^;{}()]*?\b(sdpa_\w+)\s*\(", decl):
        sym[m.group(1)] = "function (static inline)"
    for m in re.finditer(r"\btypedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", decl, flags=re.S):
        for v in re.findall(r"\b(SDPA_\w+)\s*(?:=[^,}]*)?(?:,|$)", m.group(1), flags=re.M):
            sym[v] = "enum value"
        sym[m.group(2)] = "typedef"
    for m in re.finditer(r"\btypedef\s+struct\s+\w+\s*\{.*?\}\s*(\w+)\s*;", decl, flags=re.S):
        sym[m.group(1)] = "typedef"
    for m in re.finditer(r"\btypedef\s+struct\s+\w+\s+(\w+)\s*;", decl):
        sym[m.group(1)] = "typedef"
    for m in re.finditer(r"\btypedef\b[^;{}]*?\(\s*\*\s*(\w+)\s*\)\s*\(", decl):
        sym[m.group(1)] = "typedef"
    return sym


def described(elem):
    text = ""
    for tag in ("briefdescription", "detaileddescription"):
        d = elem.find(tag)
        if d is not None:
            text += "".join(d.itertext())
    return bool(text.strip())


def reference_symbols(xml_dir, header_name):
    path = os.path.join(xml_dir, header_name.replace("_", "__").replace(".", "_8") + ".xml")
    root = ET.parse(path).getroot()
    found = {}
    # The file itself must be documented (@file): without it Doxygen leaves the file's page,
    # and with it every function, enum, typedef and macro, out of the HTML reference.
    found[header_name] = described(root.find("compounddef"))
    for m in root.iter("memberdef"):
        found[m.find("name").text] = described(m)
        for v in m.findall("enumvalue"):
            found[v.find("name").text] = described(v)
    return path, found


def main(header, xml_dir):
    sym = header_symbols(header)
    sym[os.path.basename(header)] = "file (@file block)"
    if len(sym) < 50:
        print(f"{header}: only {len(sym)} public symbols parsed; the parser is broken")
        return 1
    try:
        path, found = reference_symbols(xml_dir, os.path.basename(header))
    except (OSError, ET.ParseError) as e:
        print(f"no Doxygen XML for {header} in {xml_dir}: {e} (does sdpa.h still have @file?)")
        return 1
    missing = sorted(n for n in sym if n not in found)
    bare = sorted(n for n in sym if n in found and not found[n])
    for n in missing:
        print(f"MISSING from the reference: {n} ({sym[n]})")
    for n in bare:
        print(f"UNDOCUMENTED in the reference: {n} ({sym[n]})")
    kinds = {}
    for k in sym.values():
        kinds[k] = kinds.get(k, 0) + 1
    print(f"{header}: {len(sym)} public symbols (" +
          ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) +
          f"); {path}: {len(sym) - len(missing) - len(bare)} present and documented")
    return 1 if missing or bare else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
