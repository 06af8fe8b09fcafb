#!/usr/bin/env python3
"""Check that README.md's C usage example is examples/readme_usage.c (minus its first line,
a comment), so that the code the README shows is the code `meson test` builds and runs.

    readme_sync.py README.md examples/readme_usage.c
"""
import re
import sys


def main(readme_path, source_path):
    with open(readme_path, encoding="utf-8") as f:
        blocks = re.findall(r"^```c\n(.*?)^```$", f.read(), flags=re.M | re.S)
    with open(source_path, encoding="utf-8") as f:
        source = f.read().split("\n", 1)[1]  # drop the first line: "/* README.md's usage ... */"
    if not blocks:
        print(f"{readme_path}: no ```c block found")
        return 1
    if blocks[0].strip() != source.strip():
        print(f"{readme_path}: the first ```c block differs from {source_path}; copy one onto the other")
        return 1
    print(f"{readme_path}: usage example == {source_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
