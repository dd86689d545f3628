"""Run one robustness case through ``trilm.cli.main`` in this process and judge the outcome.

Implementation-neutral on purpose: it uses only the ``trilm`` command line and the file system (the
fixtures are built beforehand by :mod:`tests.robustness.fixtures`), so ``table.py`` can run the same
catalogue against another checkout of trilm (``main`` before the store) to give the before → after table.

A case passes when the command exits with the expected status, prints the expected words (a file name, a
tensor, a flag), ends without a traceback, leaves every protected file byte-identical, leaves nothing
where nothing should be, and writes no absolute path of this machine into what it exports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tests.robustness.cases import Case


class WouldServe(RuntimeError):
    """Raised in place of starting the HTTP server: the command accepted its input."""


@dataclasses.dataclass
class Outcome:
    case: str
    exit: int | None
    output: str
    traceback: str = ""
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self, names: dict[str, str] | None = None) -> str:
        """One line for the table: what the command did (``names`` maps paths to short names first)."""
        if self.traceback:
            text = "traceback: " + self.traceback.strip().splitlines()[-1]
        else:
            lines = [ln for ln in self.output.strip().splitlines() if ln.strip()]
            errors = [ln for ln in lines if ": error:" in ln]
            text = f"exit {self.exit}: " + (errors[-1] if errors else (lines[-1] if lines else ""))
        for path, name in (names or {}).items():
            text = text.replace(path, name)
        text = re.sub(r"/\S*/(rob-fixtures|rob-work)\S*?/", "…/", text)
        return text[:160]


def file_hashes(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _hashes(path: Path) -> dict[str, str]:
    if path.is_file():
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    return file_hashes(path) if path.is_dir() else {}


def _fill(text: str, fixtures: Path, work: Path) -> str:
    return text.replace("{F}", str(fixtures)).replace("{W}", str(work))


# ---- setups: what a case needs prepared in its work directory ------------------------------------------
def _copy(fixtures: Path, work: Path, src: str, dst: str) -> None:
    shutil.copytree(fixtures / src, work / dst, symlinks=True)


def setup_stale_lock(fixtures: Path, work: Path) -> None:
    """A suite whose run was killed by SIGKILL a moment ago: fresh metrics, a lock file nobody holds."""
    _copy(fixtures, work, "suite-stopped", "suite")
    metrics = work / "suite" / "runs" / "floatlm-pico" / "logs" / "metrics.jsonl"
    now = time.time()
    os.utime(metrics, (now, now))
    text = (work / "suite" / "toy.yaml").read_text().replace("{ROOT}", str(work / "suite" / "runs"))
    (work / "suite" / "toy.yaml").write_text(text)


def setup_changed_suite(fixtures: Path, work: Path) -> None:
    """A finished suite whose file now asks for twice the tokens (another run under the same name)."""
    _copy(fixtures, work, "suite-finished", "suite")
    path = work / "suite" / "toy.yaml"
    text = path.read_text().replace("{ROOT}", str(work / "suite" / "runs"))
    path.write_text(text.replace("tokens:\n- 4096", "tokens:\n- 8192"))


def setup_finished_suite(fixtures: Path, work: Path) -> None:
    """A finished suite, relaunched unchanged (with ``--force``: it must still not touch the finished run)."""
    _copy(fixtures, work, "suite-finished", "suite")
    path = work / "suite" / "toy.yaml"
    path.write_text(path.read_text().replace("{ROOT}", str(work / "suite" / "runs")))


def setup_killed_quantize(fixtures: Path, work: Path) -> None:
    """``trilm quantize`` killed with SIGKILL while it writes its output (its staging directory exists)."""
    out = work / "q"
    argv = [
        sys.executable,
        "-m",
        "trilm.cli",
        "quantize",
        str(fixtures / "float/snapshots/step-10"),
        "--method",
        "rtn",
        "--bits",
        "4",
        "--group-size",
        "32",
        "--calib",
        str(fixtures / "text.txt"),
        "--samples",
        "4",
        "--seq-len",
        "32",
        "--eval",
        str(fixtures / "split"),
        "--out",
        str(out),
        "--no-progress",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:
        while proc.poll() is None and time.time() < deadline:
            if any(p.name.startswith(".q.") or p.name.startswith(".tmp-q") for p in work.iterdir()):
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if out.exists() or not any(p.name.startswith(".") for p in work.iterdir()):
        raise RuntimeError("the quantize run finished before it could be killed while writing")


SETUPS = {
    "stale_lock": setup_stale_lock,
    "changed_suite": setup_changed_suite,
    "finished_suite": setup_finished_suite,
    "killed_quantize": setup_killed_quantize,
}


# ---- running ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _no_server():
    """Replace uvicorn's entry points: a command that gets that far accepted its input."""
    try:
        import uvicorn
    except ImportError:
        yield
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise WouldServe("the server would start")

    saved = uvicorn.run
    uvicorn.run = refuse
    try:
        yield
    finally:
        uvicorn.run = saved


def invoke(argv: list[str]) -> tuple[int | None, str, str]:
    """(exit status or None on an exception, captured stdout+stderr, traceback text)."""
    from trilm.cli import main

    buffer = io.StringIO()
    tb = ""
    status: int | None
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer), _no_server():
        try:
            status = int(main(argv) or 0)
        except SystemExit as exc:  # argparse
            status = exc.code if isinstance(exc.code, int) else 2
        except WouldServe:
            status = 0
            buffer.write("\n(accepted: the server would start)\n")
        except BaseException:
            status = None
            tb = traceback.format_exc()
    return status, buffer.getvalue(), tb


def run_case(case: Case, fixtures: Path, work: Path, baseline: dict[str, str]) -> Outcome:
    """Run ``case`` with its outputs under ``work`` (created empty) and judge it against its expectations."""
    fixtures, work = Path(fixtures), Path(work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if case.setup:
        SETUPS[case.setup](fixtures, work)
    for src, dst in case.copies:
        if (fixtures / src).is_dir():
            shutil.copytree(fixtures / src, work / dst)
        else:
            shutil.copyfile(fixtures / src, work / dst)
    for rel, content in case.files:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(_fill(content, fixtures, work))
    protected = {rel: _hashes(work / rel) for rel in case.protect_work}
    argv = [_fill(a, fixtures, work) for a in case.argv]
    status, output, tb = invoke(argv)
    outcome = Outcome(case.id, status, output, tb)
    problems = outcome.problems
    if tb:
        problems.append("traceback")
    elif status != case.exit:
        problems.append(f"exit {status}, expected {case.exit}")
    text = output + tb
    for word in case.expect:
        if re.search(_fill(word, fixtures, work), text) is None:
            problems.append(f"output does not name {word!r}")
    for word in case.refuse:
        if re.search(_fill(word, fixtures, work), text) is not None:
            problems.append(f"output says {word!r}")
    if file_hashes(fixtures) != baseline:
        changed = sorted(k for k, v in file_hashes(fixtures).items() if baseline.get(k) != v)
        gone = sorted(set(baseline) - set(file_hashes(fixtures)))
        problems.append(f"source files changed: {(changed + gone)[:4]}")
    for rel, before in protected.items():
        if _hashes(work / rel) != before:
            problems.append(f"{rel}: files changed")
    for rel in case.absent:
        pattern = _fill(rel, fixtures, work)
        hits = sorted(work.glob(pattern)) if not pattern.startswith("/") else []
        if hits:
            problems.append(f"left behind: {[str(h.relative_to(work)) for h in hits][:3]}")
    if case.portable and status == 0:
        needle = str(fixtures.resolve()).encode()
        for rel in case.portable:
            for path in sorted(work.glob(rel)):
                files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
                leaking = [str(f.relative_to(work)) for f in files if needle in f.read_bytes()]
                if leaking:
                    problems.append(f"machine path in {leaking[:3]}")
    return outcome
