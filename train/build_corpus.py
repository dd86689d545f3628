"""Rebuild the embedded corpus (``trilm/data/corpus/``) from Debian packages.

Usage (on a Debian 12 machine, as a maintainer; the quickstart never runs this)::

    python train/build_corpus.py --out trilm/data/corpus          # downloads the .debs with apt-get
    python train/build_corpus.py --debs /tmp/debs --out /tmp/corpus  # uses .debs already there

The corpus is a small, *real* SlimPajama look-alike so that the whole data path (reader, per-source
statistics, filtering, tokenizer, shards, sampler) runs offline on text a model can actually learn from.
Each document is labelled with the SlimPajama source (``redpajama_set_name``) whose kind of text it is
closest to; the mapping and the licenses are written to the corpus README. Everything is deterministic
(selection and order depend on content hashes only), so rerunning on the same packages gives the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import zstandard

PACKAGES = ("bible-kjv", "bible-kjv-text", "python3.11-doc", "sqlite3-doc", "libpython3.11-stdlib")
SPLITS = {"train": "example_train", "validation": "example_holdout", "test": "example_holdout"}
# One document in HOLDOUT_EVERY (per source, in hash order) goes to validation, the next one to test.
HOLDOUT_EVERY = 25
# Raw UTF-8 bytes kept per source (documents in hash order until the budget is reached).
BUDGET = {
    "RedPajamaBook": 10**9,  # the whole King James Bible (~4.3 MB)
    "RedPajamaCommonCrawl": 3_000_000,
    "RedPajamaC4": 1_800_000,
    "RedPajamaStackExchange": 10**9,  # all of the Python FAQ (~0.2 MB)
    "RedPajamaGithub": 1_300_000,
}
FILES_PER_SPLIT = {"train": (2, 4), "validation": (2, 1), "test": (2, 1)}  # (chunks, files per chunk)
ZSTD_LEVEL = 19


@dataclass(frozen=True)
class Doc:
    doc_id: str
    source: str
    text: str


def _key(doc_id: str) -> str:
    return hashlib.sha256(doc_id.encode()).hexdigest()


# ---------------------------------------------------------------- KJV (RedPajamaBook)
def kjv_books(root: Path) -> list[Doc]:
    """One document per book of the King James Bible, decoded by Debian's own ``bible`` program."""
    exe, data = root / "usr/bin/bible", root / "usr/lib"
    out = subprocess.run(
        [str(exe), "-l100000", "-p", str(data), "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True
    ).stdout
    books: dict[str, list[str]] = {}
    book = None
    for line in out.splitlines():
        header = re.fullmatch(r"(\S.*?) (\d+)", line)
        if header:
            book, chapter = header.group(1), header.group(2)
            books.setdefault(book, [book, ""])
            books[book] += [f"Chapter {chapter}", ""]
        elif line.strip() and book is not None:
            books[book].append(line.strip())
    docs = []
    for name, lines in books.items():
        text = re.sub(r"\n(Chapter \d+)\n", r"\n\n\1\n", "\n".join(lines))
        text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
        docs.append(Doc(f"kjv/{name}", "RedPajamaBook", text))
    return docs


# ---------------------------------------------------------------- HTML pages (web-like sources)
_BLOCK = {
    "p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "section", "pre", "blockquote",
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "figure", "caption",
}  # fmt: skip
_SKIP = {"script", "style", "head", "svg", "noscript", "form", "button"}


class _TextExtractor(HTMLParser):
    """Visible text of a page, the way a web crawl's text extraction sees it (block tags → newlines)."""

    def __init__(self, root_attr: tuple[str, str] | None, skip_classes: set[str]):
        super().__init__(convert_charrefs=True)
        self.root_attr, self.skip_classes = root_attr, skip_classes
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, skipping, inside root)
        self.parts: list[str] = []
        self.pre = 0

    _VOID = frozenset({"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "source", "wbr"})

    def _state(self) -> tuple[bool, bool]:
        if not self.stack:
            return False, self.root_attr is None
        return self.stack[-1][1], self.stack[-1][2]

    def handle_starttag(self, tag, attrs):
        skipping, inside = self._state()
        attrs_d = dict(attrs)
        classes = set((attrs_d.get("class") or "").split())
        if tag in _SKIP or classes & self.skip_classes:
            skipping = True
        if self.root_attr and attrs_d.get(self.root_attr[0]) == self.root_attr[1]:
            inside = True
        if tag in _BLOCK and inside and not skipping:
            self.parts.append("\n")
        if tag == "pre":
            self.pre += 1
        if tag not in self._VOID:
            self.stack.append((tag, skipping, inside))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                skipping, inside = self.stack[i][1], self.stack[i][2]
                del self.stack[i:]
                if tag in _BLOCK and inside and not skipping:
                    self.parts.append("\n")
                if tag == "pre":
                    self.pre = max(0, self.pre - 1)
                return

    def handle_data(self, data):
        skipping, inside = self._state()
        if skipping or not inside:
            return
        self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        raw = html.unescape("".join(self.parts)).replace("¶", "")
        lines = [ln[1:].rstrip() if re.match(r" \S", ln) else ln.rstrip() for ln in raw.splitlines()]
        out = re.sub(r"\n{3,}", "\n\n", "\n".join(lines))
        return out.strip() + "\n"


def html_text(path: Path, root_attr=None, skip_classes=frozenset()) -> str:
    parser = _TextExtractor(root_attr, set(skip_classes))
    parser.feed(path.read_text(encoding="utf-8", errors="strict"))
    parser.close()
    return parser.text()


def python_docs(root: Path) -> list[Doc]:
    """Python 3.11 documentation pages: reference prose → CommonCrawl, the FAQ (Q&A) → StackExchange."""
    base = root / "usr/share/doc/python3.11/html"
    docs = []
    for page in sorted(base.rglob("*.html")):
        rel = page.relative_to(base).as_posix()
        if rel.startswith(("_", "genindex", "py-modindex", "search")) or "whatsnew/changelog" in rel:
            continue
        text = html_text(page, root_attr=("role", "main"), skip_classes={"headerlink", "sphinxsidebar"})
        if len(text) < 500:
            continue
        source = "RedPajamaStackExchange" if rel.startswith("faq/") else "RedPajamaCommonCrawl"
        docs.append(Doc(f"python-doc/{rel}", source, text))
    return docs


def sqlite_docs(root: Path) -> list[Doc]:
    """SQLite's documentation pages (public domain) → C4 (clean English web pages)."""
    base = root / "usr/share/doc/sqlite3"
    docs = []
    for page in sorted(base.rglob("*.html")):
        rel = page.relative_to(base).as_posix()
        text = html_text(page, skip_classes={"nosearch", "imgcontainer", "fancy_toc"})
        if len(text) < 500 or len(text) > 150_000:  # indexes and giant generated tables are not prose
            continue
        docs.append(Doc(f"sqlite-doc/{rel}", "RedPajamaC4", text))
    return docs


def python_stdlib(root: Path) -> list[Doc]:
    """Python standard-library modules → GitHub (source code files, one per document)."""
    base = root / "usr/lib/python3.11"
    docs = []
    for src in sorted(base.rglob("*.py")):
        rel = src.relative_to(base).as_posix()
        if src.is_symlink():
            continue
        text = src.read_text(encoding="utf-8")
        if "test" in rel.split("/")[0] or len(text) < 1000 or len(text) > 120_000:
            continue
        docs.append(Doc(f"cpython-3.11/Lib/{rel}", "RedPajamaGithub", text))
    return docs


# ---------------------------------------------------------------- layout
def select(docs: list[Doc]) -> dict[str, list[Doc]]:
    """Budget per source, then a stratified train/validation/test assignment by content hash."""
    splits: dict[str, list[Doc]] = {s: [] for s in SPLITS}
    for source, budget in BUDGET.items():
        pool = sorted((d for d in docs if d.source == source), key=lambda d: _key(d.doc_id))
        used = 0
        for i, doc in enumerate(pool):
            if used >= budget:
                break
            used += len(doc.text.encode())
            split = {0: "validation", 1: "test"}.get(i % HOLDOUT_EVERY, "train")
            splits[split].append(doc)
    return splits


def write_split(out: Path, split: str, docs: list[Doc]) -> list[dict]:
    chunks, per_chunk = FILES_PER_SPLIT[split]
    n_files = chunks * per_chunk
    docs = sorted(docs, key=lambda d: _key("order/" + d.doc_id))  # SlimPajama files are shuffled mixtures
    bins: list[list[Doc]] = [[] for _ in range(n_files)]
    sizes = [0] * n_files
    for doc in sorted(docs, key=lambda d: -len(d.text)):  # largest first → balanced files
        j = min(range(n_files), key=lambda k: (sizes[k], k))
        bins[j].append(doc)
        sizes[j] += len(doc.text)
    manifest = []
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    for j, members in enumerate(bins):
        members.sort(key=lambda d: _key("order/" + d.doc_id))
        path = out / split / f"chunk{j // per_chunk + 1}" / f"{SPLITS[split]}_{j % per_chunk}.jsonl.zst"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [
            json.dumps({"text": d.text, "meta": {"redpajama_set_name": d.source}}, ensure_ascii=False)
            for d in members
        ]
        path.write_bytes(cctx.compress(("\n".join(lines) + "\n").encode()))
        rel = path.relative_to(out).as_posix()
        manifest += [
            {"file": rel, "line": i + 1, "id": d.doc_id, "source": d.source} for i, d in enumerate(members)
        ]
    return manifest


SOURCES_TEXT = """\
| redpajama_set_name | what it is here | Debian package | license |
|---|---|---|---|
| RedPajamaBook | King James Bible (1611), one document per book | bible-kjv-text (read by bible-kjv) \
| public domain |
| RedPajamaCommonCrawl | Python 3.11 documentation pages (text of the HTML) | python3.11-doc | PSF License 2 |
| RedPajamaC4 | SQLite documentation pages (text of the HTML) | sqlite3-doc | public domain |
| RedPajamaStackExchange | Python FAQ pages (question and answer) | python3.11-doc | PSF License 2 |
| RedPajamaGithub | Python 3.11 standard-library modules (source) | libpython3.11-stdlib | PSF License 2 |
"""


def write_notes(out: Path, root: Path, summary: dict[str, dict[str, int]], versions: list[str]) -> None:
    rows = "".join(
        f"| {key.split('/')[0]} | {key.split('/')[1]} | {r['documents']} | {r['bytes'] / 1e6:.2f} |\n"
        for key, r in sorted(summary.items())
    )
    (out / "README.md").write_text(
        "# Embedded corpus\n\n"
        "Real English text (and some Python code) laid out exactly like SlimPajama-627B: "
        "`{train,validation,test}/chunkK/example_{train,holdout}_N.jsonl.zst`, one JSON object per line, "
        '`{"text": ..., "meta": {"redpajama_set_name": ...}}`. It lets the whole data path run offline.\n\n'
        "Generated by `python train/build_corpus.py` (do not edit by hand) from these Debian 12 "
        "packages: " + ", ".join(versions) + ".\n\n## Sources and the SlimPajama label each one gets\n\n"
        "Each label is the SlimPajama source whose *kind* of text is closest: a printed book, web pages "
        "(documentation sites are crawled into CommonCrawl and C4), question-and-answer pages, source files. "
        "No arXiv or Wikipedia text is included.\n\n"
        + SOURCES_TEXT
        + "\n## Size (UTF-8 bytes of text)\n\n| split | source | documents | MB |\n|---|---|---|---|\n"
        + rows
        + "\n`MANIFEST.jsonl` names the origin of every line (file, line, original page or book).\n"
        "Licenses: see `LICENSE`.\n"
    )
    page = root / "usr/share/doc/python3.11/html/license.html"
    text = html_text(page, root_attr=("role", "main"), skip_classes={"headerlink"})
    psf = text[text.index("PSF LICENSE AGREEMENT FOR PYTHON") : text.index("BEOPEN.COM LICENSE")]
    (out / "LICENSE").write_text(
        "Licenses of the embedded corpus (the texts, not trilm's code)\n\n"
        "* King James Bible: public domain (Debian bible-kjv-text copyright file: the copyright of\n"
        "  the 1611 translation has expired; the data file is provided for unrestricted use).\n"
        "* SQLite documentation: public domain (dedicated by its authors; Debian sqlite3-doc\n"
        "  copyright file).\n"
        "* Python 3.11 documentation and standard library: Copyright (c) 2001-2023 Python Software\n"
        "  Foundation; All Rights Reserved. Used under the PSF License Agreement below. Changes made:\n"
        "  HTML pages were reduced to their visible text; files were selected, relabelled and re-packed\n"
        "  as JSON lines.\n\n" + psf.strip() + "\n"
    )


def build(debs: Path, out: Path) -> dict[str, dict[str, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        versions = []
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            versions.append(deb.name.removesuffix(".deb"))
        docs = kjv_books(root) + python_docs(root) + sqlite_docs(root) + python_stdlib(root)
        splits = select(docs)
        summary = _summary(splits)
        write_notes(out, root, summary, versions)
    manifest = []
    for split, members in splits.items():
        manifest += write_split(out, split, members)
    (out / "MANIFEST.jsonl").write_text("".join(json.dumps(m) + "\n" for m in manifest))
    return summary


def _summary(splits: dict[str, list[Doc]]) -> dict[str, dict[str, int]]:
    summary: dict[str, dict[str, int]] = {}
    for split, members in splits.items():
        for d in members:
            row = summary.setdefault(f"{split}/{d.source}", {"documents": 0, "bytes": 0})
            row["documents"] += 1
            row["bytes"] += len(d.text.encode())
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--debs", type=Path, help="folder with the .deb files (default: apt-get download)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        debs = args.debs
        if debs is None:
            debs = Path(tmp)
            subprocess.run(["apt-get", "download", *PACKAGES], cwd=debs, check=True)
        for old in args.out.glob("*/chunk*/*.jsonl.zst"):
            old.unlink()
        summary = build(debs, args.out)
    for key, row in sorted(summary.items()):
        print(f"{key:<40} {row['documents']:>6} docs {row['bytes'] / 1e6:>8.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
