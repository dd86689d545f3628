"""Tests, benchmarks, experiments and the library read their reference data from the repository, never from
beside it.

A plain clone must run every CPU test; data kept next to the checkout (``../shared``) or at a machine's
absolute path would make those tests skip there. This scans the Python sources for code that builds such
a path.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"""(/\s*["']shared["'])|(["'](\.\./|/work/)shared)|(["']/work/)""")


def test_no_source_builds_a_path_outside_the_repository():
    offenders = []
    for folder in (
        "trilm",
        "tests",
        "benchmarks",
        "experiments",
        "train",
        "kernels",
        "checkpoints_tools",
    ):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # its own examples below
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if OUTSIDE.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)


def test_the_pattern_catches_the_old_forms():
    for line in (
        'FIXTURES = ROOT / ".." / "shared" / "reference"',
        'Path("/work/shared") / "reference" / "fixtures"',
        'open(Path("../shared") / "reference" / "x.csv")',
    ):
        assert OUTSIDE.search(line), line
    assert not OUTSIDE.search('"""The policy-gradient search (notes in the reference folder)."""')
