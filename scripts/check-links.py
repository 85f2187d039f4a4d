#!/usr/bin/env python3
"""Checks the relative links of README.md and docs/*.md.

Every Markdown link or image `[text](target)` outside code is checked:
a file target must exist (relative to the file that links it), and a
`#anchor` must be the GitHub-style slug of a heading in the target file
(or in the linking file for `#anchor` alone). http(s) and mailto links are
skipped. With the default files it also checks that docs/SUMMARY.md (the
mdBook's table of contents) lists every page of docs/. Prints each problem
as FILE:LINE: TARGET: WHY and exits 1 if there is any.

Usage: scripts/check-links.py [FILE.md ...]   (default: README.md docs/*.md)
"""

import os
import re
import sys
import unicodedata

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
SKIPPED = ("http://", "https://", "mailto:")


def outside_fences(lines):
    """Yields (line number, text) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(lines, 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0] * 3
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        yield number, line


def strip_code(lines):
    """Yields (line number, text) with fenced blocks left out and inline code removed."""
    for number, line in outside_fences(lines):
        yield number, re.sub(r"(`+)(?:(?!\1).)+?\1", "", line)


def slug(heading):
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    kept = []
    for char in text:
        if char in "-_ ":
            kept.append("-" if char == " " else char)
        elif unicodedata.category(char)[0] in "LNM":
            kept.append(char)
    return "".join(kept)


def anchors(path, cache={}):
    """Every heading anchor of a Markdown file, numbered as GitHub numbers repeats."""
    if path not in cache:
        seen = {}
        found = set()
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
        for _, line in outside_fences(lines):
            heading = HEADING.match(line)
            if not heading:
                continue
            base = slug(heading.group(2).replace("`", ""))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        cache[path] = found
    return cache[path]


def links(path):
    """(line number, target) of every link in a Markdown file, outside code."""
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines()
    for number, text in strip_code(lines):
        for match in INLINE_LINK.finditer(text):
            yield number, match.group(1)
        definition = REFERENCE_DEF.match(text)
        if definition:
            yield number, definition.group(1)


def broken(path, target):
    """Why a link is broken, or None."""
    if target.startswith(SKIPPED):
        return None
    file_part, _, anchor = target.partition("#")
    if file_part:
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if not os.path.exists(resolved):
            return f"no such file {resolved}"
    else:
        resolved = path
    if anchor:
        if not resolved.endswith(".md") or os.path.isdir(resolved):
            return f"an anchor into {resolved}, which is not a Markdown file"
        if anchor not in anchors(resolved):
            return f"no heading with the anchor #{anchor} in {resolved}"
    return None


def unlisted_pages(summary="docs/SUMMARY.md"):
    """Pages of docs/ that the book's SUMMARY.md does not list."""
    listed = {os.path.normpath(os.path.join("docs", target.partition("#")[0])) for _, target in links(summary)}
    pages = {
        os.path.join("docs", name)
        for name in os.listdir("docs")
        if name.endswith(".md") and name != "SUMMARY.md"
    }
    return sorted(pages - listed)


def main(arguments):
    files = arguments or ["README.md"] + sorted(
        os.path.join("docs", name) for name in os.listdir("docs") if name.endswith(".md")
    )
    problems = []
    if not arguments:
        problems += [f"docs/SUMMARY.md: {page}: a page the book does not list" for page in unlisted_pages()]
    checked = 0
    for path in files:
        for number, target in links(path):
            checked += 1
            why = broken(path, target)
            if why:
                problems.append(f"{path}:{number}: {target}: {why}")
    if problems:
        print(f"{len(problems)} broken link(s):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"links: {checked} checked in {len(files)} files, none broken")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
