"""pytest plugin of the GPU suite's test stage (``-p benchmarks.gpu_pytest``).

Two things a time-boxed GPU run needs that pytest does not do by itself:

- each test's outcome and duration is appended to the JSON-lines file named by ``TRILM_TEST_LOG`` as soon as
  it is known, so a stage cut by its time limit still says which tests ran, passed and how long each took
  (the numbers that decide which tests are marked ``slow``);
- once pytest has printed its summary the process ends at once with pytest's exit status
  (``os._exit``): a process group that a test left undestroyed can hang interpreter exit after every test
  has passed, spending the stage's budget on nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

_exit_status: list[int] = []


def _record(entry: dict) -> None:
    path = os.environ.get("TRILM_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # a test's verdict is its call phase, or the setup/teardown phase that failed or skipped it
    if report.when == "call" or report.outcome != "passed":
        _record(
            {
                "test": report.nodeid,
                "phase": report.when,
                "outcome": report.outcome,
                "seconds": round(report.duration, 3),
                "at": time.time(),
            }
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))
    _record({"session": "finished", "exit_status": int(exitstatus), "at": time.time()})


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
