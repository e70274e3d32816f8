#!/usr/bin/env python3
# tools/check_notes.py — checks that every citation of a Note resolves: `Note [Title] in FILE`
# (or `Note [Title] (FILE)`) needs FILE to exist and to define Note [Title]; a citation without
# a file needs the Note defined somewhere. CI runs it (.ci/run); stdlib only, well under a second.
"""Check GHC-style Note citations across the tree.

A Note is defined in a comment as the title in brackets followed by a colon, at the start of a
comment line or after the end of a sentence on it ("// Note [Placement]: a tensor ..."), or as
the title alone on a line, its text below (a "// Note [T]" or a Markdown "## Note [T]"). Any
other occurrence of a bracketed Note title is a citation; " in FILE" (or " (FILE)") after it
names the file that must define it. Titles and paths may wrap across comment lines: comment
markers (//, #, *) and whitespace are normalised away before matching.

Usage: tools/check_notes.py [--list] [ROOT]
  exit 0 when every citation resolves, 1 otherwise (one line per failure, path:line: ...).
  --list prints every definition (title, then the files defining it) and exits.
"""

import bisect
import difflib
import os
import re
import sys

EXTENSIONS = (".h", ".cpp", ".cu", ".cuh", ".md", ".sh", ".py", ".yaml", ".cmake")
NAMES = ("CMakeLists.txt",)
# Directories never scanned (anywhere in the tree): builds, git, data, logs, caches.
SKIP_DIRS = {".git", "datasets", "logs", "runs", "Testing", ".cache", ".gpu", "__pycache__"}
# This file describes the syntax, so it is not scanned.
SELF = os.path.join("tools", "check_notes.py")

# A leading comment marker on a line: //, ///, #, *, /*, /**, with the whitespace around it.
COMMENT_LEAD = re.compile(r"^[ \t]*(?://+!?|#+|/?\*+/?)?[ \t]*")
NOTE = re.compile(r"Note \[([^\[\]]{1,200}?)\]")
# What follows a Note's closing bracket when it names a file: " in path" or " (path)", the path
# optionally in backticks, wrapped paths (a/b/ c.h) are joined below.
IN_FILE = re.compile(r"\s+in\s+`?([A-Za-z0-9_.+/-]+(?:/\s+[A-Za-z0-9_.+/-]+)*)`?")
PAREN_FILE = re.compile(r"\s+\(`?([A-Za-z0-9_.+/-]+)`?\)")
NOTES = re.compile(r"Notes ((?:\[[^\[\]]{1,200}?\](?:,? and |, |,? or )?)+)")
# After a defining Note's bracket: a colon, or a parenthetical and then a colon.
DEF_TAIL = re.compile(r"(?:\s*\([^()]{0,100}\))?:")
PATH_EXT = re.compile(r"\.(h|cpp|cu|cuh|md|sh|py|yaml|cmake|txt)$")


def scanned_files(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith("build") and x not in SKIP_DIRS)
        for f in sorted(files):
            if f.endswith(EXTENSIONS) or f in NAMES:
                rel = os.path.relpath(os.path.join(d, f), root)
                if rel != SELF:
                    out.append(rel)
    return out


class Flat:
    """A file's lines without their comment markers, joined by single spaces."""

    def __init__(self, text):
        parts, self.starts, pos = [], [], 0
        for line in text.split("\n"):
            s = COMMENT_LEAD.sub("", line, count=1).rstrip()
            self.starts.append(pos)
            parts.append(s)
            pos += len(s) + 1
        self.text = " ".join(parts)

    def line_of(self, offset):
        return bisect.bisect_right(self.starts, offset)  # 1-based

    def line_rest(self, offset):
        i = self.line_of(offset)
        end = self.starts[i] - 1 if i < len(self.starts) else len(self.text)
        return self.text[offset:end]

    def line_prefix(self, offset):
        i = self.line_of(offset) - 1
        return self.text[self.starts[i]:offset]


def norm(s):
    return re.sub(r"\s+", " ", s).strip()


def looks_like_path(p):
    return "/" in p or PATH_EXT.search(p) is not None


def is_definition(flat, m):
    """Note [T] opening a comment line (or a sentence on it) and followed by a colon, possibly
    after a parenthetical ("Note [T] (m16n8k16): ..."), or alone on its line as a heading
    ("// Note [T]" or "## Note [T]", its text on the lines below)."""
    prefix = flat.line_prefix(m.start()).strip()
    if prefix and not prefix.endswith((".", "!", "?")):
        return False
    if DEF_TAIL.match(flat.text, m.end()):
        return True
    return not prefix and flat.line_rest(m.end()).strip() == ""


def scan(root):
    """Returns (definitions: title -> set of files, citations: [(file, line, title, path)])."""
    defs, cites = {}, []
    for rel in scanned_files(root):
        try:
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        if "Note [" not in text:
            continue
        flat = Flat(text)
        t = flat.text
        for m in NOTE.finditer(t):
            title = norm(m.group(1))
            rest = t[m.end():m.end() + 300]
            path = None
            fm = IN_FILE.match(rest) or PAREN_FILE.match(rest)
            if fm:
                p = re.sub(r"/\s+", "/", fm.group(1)).rstrip(".,;:")
                if looks_like_path(p):
                    path = p
            if path is None and is_definition(flat, m):
                defs.setdefault(title, set()).add(rel)
                continue
            cites.append((rel, flat.line_of(m.start()), title, path))
        # "Notes [A], [B] and [C] in FILE": each title is a citation, of FILE when one is named.
        for m in NOTES.finditer(t):
            fm = IN_FILE.match(t, m.end()) or PAREN_FILE.match(t, m.end())
            path = None
            if fm:
                p = re.sub(r"/\s+", "/", fm.group(1)).rstrip(".,;:")
                path = p if looks_like_path(p) else None
            for b in re.finditer(r"\[([^\[\]]+)\]", m.group(1)):
                line = flat.line_of(m.start(1) + b.start())
                cites.append((rel, line, norm(b.group(1)), path))
    return defs, cites


def resolve(root, citing, path):
    """The cited path relative to root, as written: citations name the file in full (DESIGN:
    `Note [X] in FULL/PATH`), so a bare or folder-relative name does not resolve."""
    del citing
    cand = os.path.normpath(path)
    return cand if os.path.exists(os.path.join(root, cand)) else None


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.normpath(root)
    defs, cites = scan(root)
    if "--list" in argv:
        for title in sorted(defs):
            print(f"Note [{title}]: {', '.join(sorted(defs[title]))}")
        return 0

    def where(title):
        if title in defs:
            return "defined in: " + ", ".join(sorted(defs[title]))
        close = difflib.get_close_matches(title, defs.keys(), n=3, cutoff=0.75)
        hint = "; similar: " + ", ".join(f"Note [{c}] in {', '.join(sorted(defs[c]))}"
                                         for c in close) if close else ""
        return "defined nowhere" + hint

    failures = []
    for rel, line, title, path in cites:
        if path is None:
            if title not in defs:
                failures.append(f"{rel}:{line}: Note [{title}] is cited, but no file defines it "
                                f"({where(title)})")
            continue
        target = resolve(root, rel, path)
        if target is None:
            failures.append(f"{rel}:{line}: Note [{title}] cited in {path}, but {path} does not "
                            f"exist ({where(title)})")
            continue
        defining = defs.get(title, set())
        if os.path.isdir(os.path.join(root, target)):
            ok = any(f.startswith(target.rstrip("/") + "/") for f in defining)
        else:
            ok = target in defining
        if not ok:
            failures.append(f"{rel}:{line}: Note [{title}] cited in {path}, but {path} does not "
                            f"define it ({where(title)})")
    for f in failures:
        print(f, file=sys.stderr)
    n_defs = sum(len(v) for v in defs.values())
    if failures:
        print(f"check_notes: {len(failures)} of {len(cites)} Note citations do not resolve "
              f"(a Note is defined by `Note [Title]:` opening a comment line)", file=sys.stderr)
        return 1
    print(f"check_notes: all {len(cites)} Note citations resolve ({len(defs)} Notes, "
          f"{n_defs} definitions)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
