"""Which pytest-xdist worker group a test belongs to (``make test`` runs ``--dist loadgroup``).

Each test file is its own group, so its module fixtures are built once, in one worker; the files that start
daemons and multi-process launches on loopback ports share one group, so that two clusters never compete for
the same cores, ports and start-up deadlines. Kept free of torch so that a test can check the grouping in a
throwaway project (``tests/test_xdist_groups.py``)."""

from __future__ import annotations

import pytest

CLUSTER_TESTS = (
    "tests/cluster/",
    "tests/train/test_slurm.py",
    "tests/train/test_launchers.py",
    "tests/train/test_multinode.py",
)


def group_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return "cluster" if path.startswith(CLUSTER_TESTS) else path


def mark_groups(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item.nodeid)))
