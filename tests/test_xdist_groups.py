"""``make test``'s worker groups hold: under ``--dist loadgroup`` the tests of one file run in one worker and
the cluster files share one, checked in a throwaway project with the suite's own grouping (pytest 9.2 with
pytest-xdist 3.8 silently ignored every group: the launch tests then ran beside each other and timed out)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "tests/cluster/test_a.py",
    "tests/train/test_slurm.py",
    "tests/other/test_b.py",
    "tests/other/test_c.py",
)
CONFTEST = f"""
import sys

import pytest

sys.path.insert(0, {str(ROOT)!r})
from tests.support.xdist_groups import mark_groups


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    mark_groups(items)
"""


def test_each_file_runs_in_one_worker_and_the_cluster_files_in_the_same_one(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name in FILES:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"def test_{i}():\n    assert True\n\n\n" for i in range(4)))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "--import-mode=importlib", *FILES],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] .*?PASSED (\S+?)::test_\d+@(\S+)", done.stdout, re.MULTILINE)
    assert len(ran) == 4 * len(FILES), done.stdout[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, path, group in ran:
        assert group == ("cluster" if path in FILES[:2] else path), (path, group)
        workers[group].add(worker)
    assert set(workers) == {"cluster", FILES[2], FILES[3]}
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
