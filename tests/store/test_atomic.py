"""The one atomic writer: whole or nothing, markers last, and what killed writers left is cleaned."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trilm import atomic


def test_file_is_replaced_whole_or_not_at_all(tmp_path):
    path = tmp_path / "a" / "table.csv"
    atomic.write_text(path, "old\n")
    with pytest.raises(RuntimeError), atomic.atomic_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old\n" and sorted(p.name for p in path.parent.iterdir()) == ["table.csv"]
    atomic.write_json(path, {"x": 1})
    assert path.read_text() == '{\n  "x": 1\n}\n'


def test_directory_is_published_with_markers_last_and_failures_leave_nothing(tmp_path):
    final = tmp_path / "suite" / "run" / "step-1"
    seen = {}

    def markers(staging):
        seen["files"] = sorted(p.name for p in staging.iterdir())
        return {"COMPLETE": "done"}

    with atomic.atomic_directory(final, markers=markers) as tmp:
        assert tmp.name.startswith(".step-1.tmp-") and not final.exists()
        (tmp / "weights").write_bytes(b"w")
    assert seen["files"] == ["weights"] and (final / "COMPLETE").read_text() == "done"

    other = tmp_path / "fresh" / "run" / "step-2"
    with pytest.raises(ValueError), atomic.atomic_directory(other) as tmp:
        (tmp / "weights").write_bytes(b"w")
        raise ValueError("bad input found half-way")
    assert not (tmp_path / "fresh").exists()  # the parents created for it are gone too


def test_replacing_a_directory_keeps_a_whole_one_and_refuses_without_replace(tmp_path):
    final = tmp_path / "out"
    with atomic.atomic_directory(final) as tmp:
        (tmp / "v").write_text("1")
    with pytest.raises(FileExistsError), atomic.atomic_directory(final) as tmp:
        (tmp / "v").write_text("2")
    assert (final / "v").read_text() == "1"
    with atomic.atomic_directory(final, replace=True) as tmp:
        (tmp / "v").write_text("2")
    assert (final / "v").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_leftovers_of_dead_writers_are_cleaned_and_live_ones_kept(tmp_path):
    final = tmp_path / "quantlm"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
        dead_pid = int(dead.stdout)
        stale = atomic.temp_path(final, owner=f"{atomic.HOST}-{dead_pid}")
        live = atomic.temp_path(final, owner=f"{atomic.HOST}-{sleeper.pid}")
        remote = atomic.temp_path(final, owner=f"elsewhere-{dead_pid}")
        legacy = tmp_path / ".tmp-quantlm"
        unrelated = atomic.temp_path(tmp_path / "other", owner=f"{atomic.HOST}-{dead_pid}")
        for d in (stale, live, remote, legacy, unrelated):
            d.mkdir()
            (d / "half.safetensors").write_bytes(b"x")
        with atomic.atomic_directory(final) as tmp:
            (tmp / "w").write_text("new")
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(["quantlm", live.name, remote.name, unrelated.name])
        assert atomic.stale_leftovers_in(tmp_path) == [unrelated]
    finally:
        sleeper.kill()
        sleeper.wait()
