"""Every ``trilm`` command × a catalogue of bad inputs (``cases.py``): exit 2 with a message naming the file
or field, no traceback, the source files byte-identical afterwards, nothing left where nothing should be.

The fixtures are tiny (nano models, vocabulary 512) and every command runs in this process, so the whole
catalogue takes 16–90 s on two cores, depending on the load. ``python tests/robustness/table.py`` runs the
same catalogue against another checkout to give the before → after table of ``docs/store.md``.
"""

from __future__ import annotations

import pytest

from tests.robustness.cases import CASES
from tests.robustness.fixtures import build
from tests.robustness.runner import file_hashes, run_case


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = build(tmp_path_factory.mktemp("rob-fixtures") / "f")
    return root, file_hashes(root)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_safely(case, fixtures, tmp_path_factory):
    root, baseline = fixtures
    outcome = run_case(case, root, tmp_path_factory.mktemp("rob-work"), baseline)
    assert outcome.ok, f"{case.id}: {outcome.problems}; {outcome.summary()}\n{outcome.output[-2000:]}"


def test_the_catalogue_covers_every_command():
    commands = {" ".join(a for a in c.argv[:2] if not a.startswith(("-", "{"))) for c in CASES}
    firsts = {c.split()[0] for c in commands}
    from trilm.cli import COMMANDS

    assert set(COMMANDS) - firsts == {"quickstart"}, set(COMMANDS) - firsts
    assert len(CASES) >= 119
