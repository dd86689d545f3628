"""Comments and docstrings say what the code is and why, not how it came to be.

Every comment and docstring of the Python sources is scanned for the common ways a passage tells history:
an earlier state of the code ("as before", "what X did before", "before manifests existed", "pre-rename"),
a change ("used to", "no longer", "previously", "formerly", "was removed", "moved from", "the old name",
"now does", "never did", "has always had"), an anecdote ("today's path", "a run once hung") or a date in
a docstring. A passage about data that older versions wrote says what the data looks like and that it is
still read (``a marker without a manifest``), not when its writer changed.

Genuine references stay, by :data:`ALLOWED` and by the date rule:

- a date is evidence when it is part of a result's file name (``kernels-nvidia-h200-2026-12-01.json``)
  or follows "measured", "numbers of", "quickstart of" or "run of" in the same clause ("measured on an H200
  2026-12-04"): the day a figure was taken, which a reader needs to find it in ``docs/results/``;
- the phrases of :data:`ALLOWED` use a flagged word in its present, runtime sense: a process "no longer
  running", the "old" directory an atomic replace moves aside, "what was removed" by a cleanup, a
  "before → after" table that compares two checkouts.

A paper citation ("Luo et al. 2025"), an issue named for its targets ("the targets of issue 24") and "before
the cooldown" (a position in a run) match no rule, so need no entry. Only the files whose text holds a form
no rule spares are tokenized and parsed: about half a CPU second for the whole tree.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOTS = ("trilm", "kernels", "train", "checkpoints_tools", "benchmarks", "experiments", "tests")
THIS = Path(__file__).resolve()
"""This file is left out: its docstring and patterns quote the phrases it looks for."""

HISTORY = re.compile(
    r"""\b(?:
      used\ to\b
    | no\ longer\b
    | previously\b
    | formerly\b
    | (?:was|were|has\ been|have\ been)\ (?:removed|deleted|renamed|retired|dropped)\b
    | moved\ (?:from|to)\b
    | the\ old\ \w+
    | now\ (?:does|do|uses|lives|goes|returns|raises|writes|reads|takes|keeps|comes|gives|runs)\b
    | never\ did\b
    | (?:has|have)\ always\b | always\ had\b
    | any\s*more\b
    | today's\b
    | once\ (?:passed|hung|failed|took|gave|broke|crashed|ran)\b
    | pre-rename\b | legacy\b
    | (?:as|did|than)\ before\b
    | before\ (?:\S+\ ){1,3}?(?:existed|had\ (?:one|a|an|them|it))\b
    | before\ (?:the\ )?\w+\ (?:were|was)\ (?!(?:\w+ed|written|read|done|run|taken|seen|given|known)\b)
    | (?:quoted|wrote|printed)\ before\b
    | before\ (?:issue|wave|commit|the\ (?:change|rename|refactor|fix|split|move))\b
    | before\ (?:vs|→|/)\ after\b
    )""",
    re.IGNORECASE | re.VERBOSE,
)
"""The forms a history passage takes (one match is one finding)."""

ALLOWED = (
    "what was removed",  # what a cleanup deleted, returned to its caller
    "no longer running",  # a process that has exited (trilm.atomic's leftovers of dead writers)
    "no longer lists",  # squeue after a job has left the queue
    "the old one",  # the directory an atomic replace moves aside (trilm.atomic)
    "the old ones",  # buffers a captured CUDA graph may still point to
    "the old directory",  # the same, in publish_directory
    "the old finished one",  # a shard being rewritten (trilm.data.shards)
    "the old target",  # what a crash leaves in place of a half-written file
    "before → after",  # a table comparing two checkouts (tests/robustness), not a change of this one
)
"""Phrases where a flagged word means the present, runtime fact; each says why it is kept."""

PASSIVE = re.compile(r"\b(is|are|be|been|being|was|were|not)\s+$", re.IGNORECASE)
"""Before "used to": the passive "is used to match" says what a thing is for, not what it did."""

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
DATE_EVIDENCE = re.compile(r"\b(measured|numbers of|quickstart of|run of)\b[^.;]*$", re.IGNORECASE)
"""Words that make the date after them, in the same clause, the day a figure was taken."""


HISTORY_ANY_SPACE = re.compile(HISTORY.pattern.replace(r"\ ", r"\s+"), HISTORY.flags)
"""The same forms across line breaks: a cheap first look at a whole file, so only the few files with a
match are tokenized and parsed (that keeps the test well under a second)."""


def _worth_a_look(text: str) -> bool:
    """Whether ``text``, code and all, holds a form no rule spares (a superset of the findings)."""
    return any(not _spared(text, m) for m in HISTORY_ANY_SPACE.finditer(text)) or any(
        not _date_is_evidence(text, m.start(), m.end()) for m in DATE.finditer(text)
    )


def _sources() -> list[Path]:
    """The files worth a close look: those whose text holds a flagged form or a date anywhere."""
    return sorted(
        p
        for root in ROOTS
        if (ROOT / root).is_dir()
        for p in (ROOT / root).rglob("*.py")
        if p.resolve() != THIS and _worth_a_look(p.read_text(encoding="utf-8"))
    )


def _passages(path: Path) -> list[tuple[int, str, bool]]:
    """(line, text, is_docstring) for every comment and docstring (a string standing alone) of ``path``."""
    src = path.read_text(encoding="utf-8")
    found = [
        (tok.start[0], tok.string, False)
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(src)):
        # a module's, class's or function's docstring, and the string under an attribute that documents it
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.append((node.lineno, node.value.value, True))
    return found


def _allowed(flat: str, start: int, end: int) -> bool:
    """Whether ``flat[start:end]`` lies inside one of the :data:`ALLOWED` phrases."""
    low = flat.lower()
    for phrase in ALLOWED:
        at = low.find(phrase)
        while at >= 0:
            if at <= start and end <= at + len(phrase):
                return True
            at = low.find(phrase, at + 1)
    return False


def _spared(text: str, m: re.Match[str]) -> bool:
    """Whether the history form ``m`` in ``text`` is a passive "used to" or inside an allowed phrase."""
    if m.group(0).lower().startswith("used") and PASSIVE.search(text[max(0, m.start() - 12) : m.start()]):
        return True
    return _allowed(text, m.start(), m.end())


def _date_is_evidence(text: str, start: int, end: int) -> bool:
    """A date inside a file name, or after the words that say a figure was taken that day."""
    if text[start - 1 : start] in ("-", "_", "/") or re.match(r"[-_.]\w", text[end : end + 2]):
        return True
    return bool(DATE_EVIDENCE.search(" ".join(text[max(0, start - 40) : start].split())))


def _findings(path: Path, root: Path = ROOT) -> list[str]:
    """One line per history passage of ``path``: where, and the text around it."""
    out = []
    rel = path.relative_to(root)
    for line, text, is_doc in _passages(path):
        flat = " ".join(text.split())  # a phrase may wrap across docstring lines
        for m in HISTORY.finditer(flat):
            if not _spared(flat, m):
                out.append(f"{rel}:{line}: {flat[max(0, m.start() - 60) : m.end() + 60]!r}")
        if is_doc:
            for m in DATE.finditer(text):
                if not _date_is_evidence(text, m.start(), m.end()):
                    at = line + text.count("\n", 0, m.start())
                    out.append(f"{rel}:{at}: date {m.group(0)} in a docstring")
    return out


def test_comments_say_what_is_not_what_was():
    findings = [f for path in _sources() for f in _findings(path)]
    assert not findings, "history in comments or docstrings:\n" + "\n".join(findings)


def test_the_rule_tells_history_from_runtime(tmp_path):
    """The forms it flags and the genuine references it keeps, on a file written here."""
    history = [
        "# the command the docs quoted before the areas were packages",
        "# it used to raise IndexError",
        "# exports written before fingerprints existed",
        "# the old name, kept as an alias",
        "# re-quantized, as before",
        "# the pipeline now does it per call",
        "# no longer needed",
        "# a GPU run once hung at exit",
    ]
    runtime = [
        "# refused before anything was written",
        "# not used to match sizes",
        "# the pid is no longer running",
        "# the old directory is moved aside",
        "# before the cooldown the rate is constant",
        "# the before → after table of docs/store.md",
        "# returns what was removed",
    ]
    dated = (
        '"""Measured on an H200 2026-12-04; see kernels-nvidia-h200-2026-12-01.json. Fixed 2026-12-05."""\n'
    )
    path = tmp_path / "sample.py"
    path.write_text(dated + "\n".join(history + runtime) + "\n")
    found = _findings(path, tmp_path)
    assert len(found) == len(history) + 1, "\n".join(found)
    assert sum("2026-12-05" in f for f in found) == 1
