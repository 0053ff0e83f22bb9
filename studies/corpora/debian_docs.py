"""Build the 2026 table's text corpus: the English documentation three Debian packages ship,
one JSON Lines record per document (`text`, `name`), for `task.path: corpora/debian-docs.jsonl`.

    sudo apt-get install linux-doc-6.1 python3.11-doc perl-doc     # `make corpus` does both steps
    python studies/corpora/debian_docs.py                          # writes studies/corpora/debian-docs.jsonl

Why these: the issue asked for the largest natural-language corpus the project's registries give.
Measured on Debian 12 (2026-12-06): the Linux kernel's documentation sources (reStructuredText,
English only: translations/ skipped) 21.4 MB in 3,000+ documents, the Python 3.11 documentation's
sources 11.0 MB, Perl's pod manuals 9.1 MB. Larger Debian documentation (the Debian Handbook, the
PostgreSQL manual) ships as HTML only; PyPI's text-bearing packages are far smaller, and corpora on
PyPI (nltk's, for one) download their data at run time, which this machine cannot. The text is
technical English with code blocks and light markup, kept as written (no markup stripped: a
stripper would be one more thing to trust). Duplicates (the kernel repeats boilerplate, perl's
delta manuals repeat each other) are left for `workbench prepare` (task.dedupe: near) to remove
before the split, which it counts.

Received files are data: only regular files under the three packages' folders are read, a file is
read as UTF-8 with undecodable bytes replaced, and the output is written beside this script,
atomically (a temporary file renamed).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

OUT = Path(__file__).with_name("debian-docs.jsonl")
SOURCES = (  # (package, folder, file suffix, sub-folders skipped)
    ("linux-doc-6.1", Path("/usr/share/doc/linux-doc-6.1/html/_sources"), ".rst.txt", {"translations"}),
    ("python3.11-doc", Path("/usr/share/doc/python3.11/html/_sources"), ".rst.txt", set()),
    ("perl-doc", Path("/usr/share/perl/5.36/pod"), ".pod", set()),
)


def documents(package: str, folder: Path, suffix: str, skipped: set[str]):
    """(name, text) of each regular file under `folder` ending in `suffix`, sorted by name."""
    for path in sorted(folder.rglob(f"*{suffix}")):
        relative = path.relative_to(folder)
        if relative.parts[0] in skipped or path.is_symlink() or not path.is_file():
            continue
        yield f"{package}/{relative}", path.read_bytes().decode("utf-8", errors="replace")


def main() -> int:
    missing = [package for package, folder, _, _ in SOURCES if not folder.is_dir()]
    if missing:
        print(f"debian_docs: not installed: {', '.join(missing)}; install them with "
              f"`apt-get install {' '.join(missing)}` (or `make corpus`)", file=sys.stderr)
        return 1
    partial = OUT.with_suffix(".jsonl.part")
    counts = {}
    with open(partial, "w", encoding="utf-8") as out:
        for package, folder, suffix, skipped in SOURCES:
            n = size = 0
            for name, text in documents(package, folder, suffix, skipped):
                out.write(json.dumps({"name": name, "text": text}, ensure_ascii=False) + "\n")
                n, size = n + 1, size + len(text.encode())
            counts[package] = (n, size)
    os.replace(partial, OUT)
    for package, (n, size) in counts.items():
        print(f"{package}: {n:,} documents, {size / 1e6:.1f} MB")
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
