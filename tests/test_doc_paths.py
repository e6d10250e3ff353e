"""The docs name only files that exist: every relative link in README.md, CONTRIBUTING.md and
docs/*.md, and every path they name in backticks, is in the repository (a `file.py::test_name`
names a test that file defines, a pattern such as `docs/*.md` matches a file); none points outside it.

A backticked path is one whose first part is a top-level entry of the repository (`dualjax/...`,
`tests/...`), or any path with a `/` that ends in a file name (`runs/x/report.json`), or one that
starts with `../`. Backticked paths are read from the repository root; links from the doc's own
folder.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ["README.md", "CONTRIBUTING.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]

# ALLOW-LIST 1: outputs. Paths a command writes (a run's directory, a benchmark's results, caches);
# they do not exist until something runs.
OUTPUTS = ("OUT/", "runs/", "gpu-out/", "~/", ".cache/", "data/")  # data/: a KV store's own files

# ALLOW-LIST 2: pending fixes in docs other changes of the same issue rewrite; remove an entry once
# its doc no longer names it (the test fails on an entry no doc names any more, so none lingers).
PENDING: set[tuple[str, str]] = set()

TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"}
TICKED = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FILE_NAME = re.compile(r"/[\w.<>*-]*\.[A-Za-z]\w*(::\w+|:\w+)?$")


def named_paths(doc: str) -> list[tuple[str, pathlib.Path, str | None]]:
    """(as written, the path it names, the test it names) for every path `doc` names."""
    text = (ROOT / doc).read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # commands and trees, not references
    out = []
    for target in LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        out.append((target, (ROOT / doc).parent / target.split("#")[0], None))
    for token in TICKED.findall(text):
        first = token.split("/")[0]
        if "/" not in token or not (first in TOP or first == ".." or FILE_NAME.search(token)):
            continue
        path, _, test = token.partition("::")
        path = re.sub(r"(\.\w+):\w+$", r"\1", path)  # `file.py:NAME`: the file
        out.append((token, ROOT / path, test or None))
    return out


def test_named_paths_exist():
    bad = []
    for doc in DOCS:
        if not (ROOT / doc).exists():
            bad.append(f"{doc}: missing")
            continue
        for token, path, test in named_paths(doc):
            if token.startswith(OUTPUTS) or (doc, token) in PENDING:
                continue
            inside = path.resolve().is_relative_to(ROOT)
            exists = any(ROOT.glob(path.relative_to(ROOT).as_posix())) if inside and "*" in token else path.exists()
            if not inside or not exists:
                bad.append(f"{doc}: `{token}` " + ("points outside the repository" if not inside else "does not exist"))
            elif test and not re.search(rf"^def {re.escape(test)}\(", path.read_text(), re.M):
                bad.append(f"{doc}: `{token}`: {path.name} has no {test}")
    assert not bad, "docs name paths that are not in the repository:\n" + "\n".join(bad)


def test_pending_entries_are_still_named():
    named = {(doc, token) for doc in DOCS if (ROOT / doc).exists() for token, _, _ in named_paths(doc)}
    stale = sorted(PENDING - named)
    assert not stale, f"fixed: remove these from PENDING: {stale}"
