"""What the repository's layout promises, checked on the sources: the library holds the product and runs
from a wheel, benchmarks run as modules of the ``benchmarks`` package, and nothing outside ``tests/``
depends on the tests.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(
    p for p in (ROOT / "benchmarks").glob("*.py") if p.name not in ("__init__.py", "common.py")
)
NOT_TESTS = ("trilm", "kernels", "benchmarks", "train", "checkpoints_tools")


def _imports(path: Path) -> list[str]:
    """Every module name a source file imports (absolute imports, at any depth of the file)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _sources(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


HARNESS_USERS = {"benchmarks/train/multinode.py": "tests.support.cluster"}
"""Checkout-only tools that drive the tests' harness itself: the multi-node drills time the loopback cluster
that the multi-node tests launch, so they take it from ``tests/support`` rather than keep a second copy."""


def _is_under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_nothing_outside_tests_imports_the_tests():
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _sources(*NOT_TESTS)
        for name in _imports(p)
        if _is_under(name, "tests")
        and not (
            str(p.relative_to(ROOT)) in HARNESS_USERS
            and _is_under(name, HARNESS_USERS[str(p.relative_to(ROOT))])
        )
    ]
    assert not offenders, "\n".join(offenders)


BENCHMARK_SUBJECTS = {"tests/test_layout.py": "the layout of benchmarks/ and its result writer"}
"""Tests whose subject is the benchmarks package itself; any other test takes its helpers from the library
or ``tests/support``, so that the tests run without the benchmarks."""
NOT_YET_MOVED = {
    "tests/kernels/test_compile_sm90.py",
    "tests/kernels/test_cpu_backend.py",
    "tests/kernels/test_fused_decode.py",
    "tests/kernels/test_gpu.py",
    "tests/kernels/test_host_path.py",
    "tests/kernels/test_kernels_interp.py",
    "tests/kernels/test_launch_plans.py",
    "tests/kernels/test_quant_linear.py",
    "tests/kernels/test_tensor_core_gemm.py",
    "tests/posthoc/test_posthoc_real_blocks.py",
    "tests/posthoc/test_posthoc_real_report.py",
    "tests/scaling/test_cooldown_report.py",
}
"""Tests that still import a benchmark's helpers (kernel_tools' samples, the post-hoc and cooldown reports):
issue 46 item 2, in areas being edited elsewhere. The list may only shrink."""


def test_no_test_imports_the_benchmarks():
    """The harness lives with the tests: a test that imports ``benchmarks`` breaks when a benchmark moves.
    Running a benchmark's command line as a subprocess is fine; that is not an import."""
    importers = {
        str(p.relative_to(ROOT))
        for p in _sources("tests")
        for name in _imports(p)
        if _is_under(name, "benchmarks")
    }
    offenders = importers - set(BENCHMARK_SUBJECTS) - NOT_YET_MOVED
    assert not offenders, sorted(offenders)
    assert importers >= NOT_YET_MOVED, (
        f"no longer importing benchmarks, drop: {sorted(NOT_YET_MOVED - importers)}"
    )


def test_no_script_edits_the_import_path():
    """Benchmarks run as ``python -m benchmarks.NAME`` and the tools import the installed trilm."""
    pattern = re.compile(r"sys\.path\s*(\.insert|\.append|\[|\+=|=)")
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources("benchmarks", "checkpoints_tools", "train", "trilm", "kernels")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders


def test_the_library_does_not_locate_the_checkout():
    """An installed wheel has no checkout around it: package data is read with importlib.resources."""
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources("trilm", "kernels")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "REPO_ROOT" in line or re.search(r"__file__\)\.(resolve\(\)\.)?parents\[[1-9]\]", line)
    ]
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("trilm.posthoc", "trilm.train"), ("trilm.store", "trilm.train"), ("trilm.store", "megatron")],
)
def test_layers_that_must_not_depend_on_the_trainer(package, forbidden):
    folder = ROOT / Path(*package.split("."))
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in sorted(folder.rglob("*.py"))
        for name in _imports(p)
        if name == forbidden or name.startswith(forbidden + ".")
    ]
    assert not offenders, "\n".join(offenders)


HELPERS = {
    "posthoc_model": "prepares the FloatLM the post-hoc benchmarks share",
    "posthoc_real_report": "renders posthoc_real's results as Markdown",
    "posthoc_real_llmcompressor": "posthoc_real's worker in llmcompressor's own environment (a timing file)",
    "serve_process": "trilm serve as a child process for serve_load and real_serve_chat",
    "cooldown_diagnosis": "the cooldown report's section on why the additive law misses",
    "gpu_pytest": "the GPU suite's pytest plugin: each test's outcome as a JSON line, no hang at exit",
    "serve_report": "renders the serving benchmark's results as a console table and as Markdown",
}
"""Modules of benchmarks/ that are parts of a benchmark, not benchmarks: they write no result file."""


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_every_benchmark_describes_its_machine_through_the_common_module(path):
    """One machine description and one result writer (benchmarks/common.py): a script that writes results
    writes them through it and builds no machine description of its own."""
    text = path.read_text()
    assert "platform.platform(" not in text and '"machine": {' not in text, path.name
    if path.stem in HELPERS:
        return
    assert "json.dump(" not in text and ".write_text(json.dumps" not in text, path.name
    assert "write_result(" in text, f"{path.name} writes no result through benchmarks.common"


def test_every_benchmark_imports_as_a_module_of_the_package():
    """``python -m benchmarks.NAME`` works only if the module imports with the repository root on the path
    (what ``-m`` gives) and nothing else."""
    for path in BENCHMARKS:
        module = importlib.import_module(f"benchmarks.{path.stem}")
        assert module.__spec__.name == f"benchmarks.{path.stem}"


def test_the_result_writer_records_device_date_and_command(tmp_path):
    from benchmarks.common import machine, write_result

    path = write_result(tmp_path / "r" / "x.json", {"rows": [1]}, module="benchmarks.demo", argv=["--a", "1"])
    import json

    data = json.loads(path.read_text())
    assert data["command"] == "python -m benchmarks.demo --a 1" and data["rows"] == [1]
    assert set(data["device"]) == set(machine()) and data["date"][:4].isdigit()
    assert not list(path.parent.glob(".*tmp*"))  # written through a rename, nothing left behind


def test_no_tracked_file_cites_notes_outside_the_repository():
    """A clone holds only the repository: a citation of the ``shared`` notes kept beside the original
    checkout leads a reader nowhere. The facts they held are in docs/references.md; a measurement of ours
    is cited by the committed file that holds it. (The pattern is spelled ``shared[/]`` so that this file
    does not match itself.)"""
    try:
        listed = subprocess.run(
            ["git", "grep", "-n", "-I", "-E", r"shared[/]"], cwd=ROOT, capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("no git executable")
    if listed.returncode not in (0, 1):  # 1: no match; anything else: not a git checkout
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    assert listed.stdout == "", "tracked files citing notes outside the repository:\n" + listed.stdout


RESULTS = ROOT / "docs" / "results"


def test_the_evidence_holds_no_code():
    """docs/results/ holds reports, data and pictures; the code that writes them is in benchmarks/."""
    assert not sorted(str(p.relative_to(ROOT)) for p in RESULTS.rglob("*.py"))


def test_the_evidence_index_names_every_folder():
    index = (RESULTS / "README.md").read_text()
    missing = [p.name for p in sorted(RESULTS.iterdir()) if p.is_dir() and f"[{p.name}/]" not in index]
    assert not missing, f"docs/results/README.md does not index {missing}"


def _documented_benchmarks() -> list[str]:
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "benchmarks").rglob("README.md")]
    found = {m for page in pages for m in re.findall(r"python -m (benchmarks(?:\.\w+)+)", page.read_text())}
    return sorted(m for m in found if (ROOT / Path(*m.split("."))).with_suffix(".py").is_file())


def test_every_documented_benchmark_answers_help():
    """Every command the docs quote still parses its arguments, run as a reader runs it."""
    modules = _documented_benchmarks()
    assert "benchmarks.scaling.ladder.report" in modules
    failed = []
    for start in range(0, len(modules), 4):
        batch = {
            m: subprocess.Popen(
                [sys.executable, "-m", m, "--help"],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for m in modules[start : start + 4]
        }
        for m, proc in batch.items():
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0 or b"usage:" not in out:
                failed.append(f"{m}: exit {proc.returncode}: {out.decode(errors='replace')[-300:]}")
    assert not failed, "\n".join(failed)
