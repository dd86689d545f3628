"""What the repository's layout promises, checked on the sources: the library holds the product and runs
from a wheel, benchmarks run as modules of the ``benchmarks`` package, each folder of ``docs/results/``
names the driver that writes it (an experiment of ``experiments/`` or a command of trilm), no library
module or test imports an experiment, and nothing outside ``tests/`` depends on the tests.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trilm.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
AREAS = sorted(p.parent for p in BENCH.glob("*/__init__.py"))
"""The packages of benchmarks/, one per area (kernels, train, posthoc, serve, scaling, data)."""
EXPERIMENTS = ROOT / "experiments"
EXPERIMENT_PACKAGES = sorted(p.parent for p in EXPERIMENTS.glob("*/__init__.py"))
"""One package per folder of docs/results/ that an experiment writes (``posthoc-real`` → ``posthoc_real``)."""


def _is_alias(path: Path) -> bool:
    """A module that forwards its command to another for one release (its docstring says "Alias of")."""
    return path.read_text().startswith('"""Alias of ')


MODULES = sorted(
    p
    for area in AREAS
    for p in area.rglob("*.py")
    if p.name not in ("__init__.py", "__main__.py") and not _is_alias(p)
)
"""Every module of the areas: a benchmark (a command) or, named ``_name.py``, a helper of benchmarks."""
ALIASES = sorted(p for area in AREAS for p in area.rglob("*.py") if _is_alias(p))
"""Old commands kept for one release, each forwarding to the module that runs it now."""


def _is_command(path: Path) -> bool:
    return re.search(r"^if __name__ == .__main__.:", path.read_text(), re.MULTILINE) is not None


def _is_helper(path: Path) -> bool:
    return path.name.startswith("_")


BENCHMARKS = [p for p in MODULES if not _is_helper(p)]
HELPERS = [p for p in MODULES if _is_helper(p)]
NOT_TESTS = (
    "trilm",
    "kernels",
    "benchmarks",
    "experiments",
    "train",
    "checkpoints_tools",
)


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


def _is_under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_nothing_outside_tests_imports_the_tests():
    """The tests stand on the code, never the other way: what a benchmark shares with a test (the loopback
    cluster the multi-node drills and tests both launch) is a package of its own,
    ``trilm.testing.cluster``."""
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _sources(*NOT_TESTS)
        for name in _imports(p)
        if _is_under(name, "tests")
    ]
    assert not offenders, "\n".join(offenders)


BENCHMARK_SUBJECTS = {"tests/test_layout.py": "the layout of benchmarks/ and its result writer"}
"""Tests whose subject is the benchmarks package itself; any other test takes its helpers from the library
or ``tests/support``, so that the tests run without the benchmarks."""


def test_no_test_imports_the_benchmarks():
    """The harness lives with the tests: a test that imports ``benchmarks`` breaks when a benchmark moves.
    Running a benchmark's command line as a subprocess is fine; that is not an import."""
    importers = {
        str(p.relative_to(ROOT))
        for p in _sources("tests")
        for name in _imports(p)
        if _is_under(name, "benchmarks")
    }
    offenders = importers - set(BENCHMARK_SUBJECTS)
    assert not offenders, sorted(offenders)


def test_no_test_or_library_module_imports_an_experiment():
    """An experiment is a leaf: it may change or go with its report, so nothing else stands on it. A test
    runs an experiment's command in a subprocess; the only importers are ``benchmarks`` aliases of its
    commands (for one release)."""
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _sources("trilm", "kernels", "tests", "train", "checkpoints_tools", "benchmarks")
        if p not in ALIASES
        for name in _imports(p)
        if _is_under(name, "experiments")
    ]
    assert not offenders, "\n".join(offenders)


def test_the_library_does_not_import_the_benchmarks():
    """What a benchmark and a test share (a report's verdicts, a fit, a compiler) lives in the library and the
    benchmark imports it, never the other way: a wheel has no ``benchmarks`` package."""
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _sources("trilm", "kernels")
        for name in _imports(p)
        if _is_under(name, "benchmarks")
    ]
    assert not offenders, "\n".join(offenders)


def test_no_script_edits_the_import_path():
    """Benchmarks run as ``python -m benchmarks.NAME`` and the tools import the installed trilm."""
    pattern = re.compile(r"sys\.path\s*(\.insert|\.append|\[|\+=|=)")
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources("benchmarks", "experiments", "checkpoints_tools", "train", "trilm", "kernels")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders


def test_the_library_does_not_locate_the_checkout():
    """An installed wheel has no checkout around it: package data is read with importlib.resources.
    ``trilm.testing`` (the loopback cluster the tests and drills launch from the checkout) is not in the
    wheel."""
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources("trilm", "kernels")
        if p.relative_to(ROOT).parts[:2] != ("trilm", "testing")
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


TOOL_FOLDERS = ("benchmarks/kernels/tools",)
"""Folders of tools that write tables from what the CPU gives (launch plans), not measurements of this
machine: no machine description to record."""


def test_the_top_of_benchmarks_holds_no_benchmark():
    """Only what every area shares sits at the top: the result writer (``common.py``), the GPU suite's pytest
    plugin (``gpu_pytest.py``) and the suite's two scripts, whose paths are commands the docs quote."""
    assert [p.name for p in BENCH.glob("*.py") if _is_command(p)] == []
    assert sorted(p.name for p in BENCH.glob("*.sh")) == ["gpu_suite.sh", "gpu_wheels.sh"]


def test_helpers_are_named_as_helpers():
    """A module with no command of its own is a part of a benchmark and says so in its name (``_name.py``);
    a helper writes no result file of its own (it may have a command that prepares shared inputs)."""
    unnamed = [str(p.relative_to(ROOT)) for p in BENCHMARKS if not _is_command(p)]
    assert not unnamed, f"modules without a command, not named _name.py: {unnamed}"
    writers = [str(p.relative_to(ROOT)) for p in HELPERS if "write_result(" in p.read_text()]
    assert not writers, f"helpers that write a result: {writers}"


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: str(p.relative_to(BENCH).with_suffix("")))
def test_every_benchmark_describes_its_machine_through_the_common_module(path):
    """One machine description and one result writer (benchmarks/common.py): a script that writes results
    writes them through it and builds no machine description of its own."""
    text = path.read_text()
    assert "platform.platform(" not in text and '"machine": {' not in text, path.name
    if str(path.parent.relative_to(ROOT)).startswith(TOOL_FOLDERS):
        return
    assert "json.dump(" not in text and ".write_text(json.dumps" not in text, path.name
    assert "write_result(" in text, f"{path.name} writes no result through benchmarks.common"


def test_every_benchmark_imports_as_a_module_of_the_package():
    """``python -m benchmarks.AREA.NAME`` works only if the module imports with the repository root on the
    path (what ``-m`` gives) and nothing else."""
    for path in MODULES:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module = importlib.import_module(name)
        assert module.__spec__.name == name


def test_every_area_has_a_readme_naming_its_benchmarks():
    """Each area says what it measures, its targets and where its results are; every benchmark of it is
    named in the nearest README above it (by file name or by its command)."""
    assert {p.name for p in AREAS} >= {"kernels", "train", "posthoc", "serve", "scaling", "data"}
    missing = [str(a.relative_to(ROOT)) for a in AREAS if not (a / "README.md").is_file()]
    assert not missing, f"areas without a README.md: {missing}"
    unnamed = []
    for path in BENCHMARKS:
        folder = next(f for f in path.parents if (f / "README.md").is_file())
        text = (folder / "README.md").read_text()
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if str(path.relative_to(folder)) not in text and f"python -m {dotted}" not in text:
            unnamed.append(f"{path.relative_to(ROOT)} (in {(folder / 'README.md').relative_to(ROOT)})")
    assert not unnamed, f"benchmarks their README does not name: {unnamed}"


TABLE = ROOT / "docs" / "benchmarks.md"


def _module_of(command: str) -> Path | None:
    """The file ``python -m COMMAND`` runs: a module, or the main module a package's ``__main__`` imports
    (an area's main benchmark, an experiment's driver)."""
    path = ROOT / Path(*command.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    main = path / "__main__.py"
    if main.is_file():
        return _forwards_to(main)
    return None


def _forwards_to(path: Path) -> Path:
    """The module whose ``main`` a ``__main__.py`` or an alias runs."""
    (target,) = re.findall(r"^from ([\w.]+) import main$", path.read_text(), re.MULTILINE)
    return ROOT / Path(*target.split(".")).with_suffix(".py")


def test_the_benchmark_table_lists_every_benchmark():
    """docs/benchmarks.md: one row per benchmark, its command running the module the row names."""
    row = re.compile(r"^\| `python -m (benchmarks[\w.]*)` \| `([\w/]+\.py)` \|", re.MULTILINE)
    rows = row.findall(TABLE.read_text())
    listed = {BENCH / module: command for command, module in rows}
    assert len(listed) == len(rows), "a module listed twice"
    assert sorted(listed) == BENCHMARKS, (
        f"not in the table: {sorted(str(p.relative_to(BENCH)) for p in set(BENCHMARKS) - set(listed))}; "
        f"not a benchmark: {sorted(str(p.relative_to(BENCH)) for p in set(listed) - set(BENCHMARKS))}"
    )
    wrong = [f"{c} runs {_module_of(c)}, not {m}" for m, c in listed.items() if _module_of(c) != m]
    assert not wrong, wrong


ALIAS_ROW = re.compile(
    r"^\| `python -m (benchmarks[\w.]*)` \| `python -m ((?:experiments|benchmarks)[\w.]*)` \|", re.MULTILINE
)
"""A row of docs/benchmarks.md's table of aliases: the alias, the command it runs."""


def test_every_alias_forwards_to_the_command_the_table_names():
    """An old command kept for one release runs the module its row in docs/benchmarks.md names, so a
    reader of an old page finds where it went; every row is an alias that exists."""
    moved = dict(ALIAS_ROW.findall(TABLE.read_text()))
    aliases = {".".join(p.relative_to(ROOT).with_suffix("").parts): p for p in ALIASES}
    assert sorted(moved) == sorted(aliases), (
        f"aliases without a row: {sorted(set(aliases) - set(moved))}; "
        f"rows without an alias: {sorted(set(moved) - set(aliases))}"
    )
    wrong = [
        f"{old} runs {_forwards_to(path).relative_to(ROOT)}, the table says {moved[old]}"
        for old, path in aliases.items()
        if _module_of(moved[old]) != _forwards_to(path)
    ]
    assert not wrong, wrong


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
    """docs/results/ holds reports, data and pictures; the code that writes them, and the ``commands.sh`` of
    what ran, are the experiment's (experiments/NAME/), or the driver is trilm's own command."""
    assert not sorted(str(p.relative_to(ROOT)) for p in (*RESULTS.rglob("*.py"), *RESULTS.rglob("*.sh")))


def test_the_evidence_index_names_every_folder():
    index = (RESULTS / "README.md").read_text()
    missing = [p.name for p in sorted(RESULTS.iterdir()) if p.is_dir() and f"[{p.name}/]" not in index]
    assert not missing, f"docs/results/README.md does not index {missing}"


def _index_drivers() -> dict[str, tuple[str, str]]:
    """docs/results/README.md: folder → (its page, the first command of its "regenerated by" column)."""
    drivers = {}
    for line in (RESULTS / "README.md").read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        link = re.fullmatch(r"\[([\w-]+)/\]\(([^)]+)\)", cells[0]) if len(cells) == 4 else None
        if link:
            command = re.search(r"`([^`]+)`", cells[2])
            drivers[link[1]] = (link[2], command[1] if command else "")
    return drivers


def _driver_exists(command: str) -> bool:
    """A driver is a module's command (``python -m experiments.NAME``; not an alias kept for one release), a
    command of trilm (``trilm NAME``), a make target or a script by path (``python PATH``, with environment
    settings before it)."""
    words = command.split()
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)
    if words[:2] == ["python", "-m"] and len(words) > 2:
        module = _module_of(words[2])
        return module is not None and module not in ALIASES
    if words[:1] == ["python"] and len(words) > 1:
        return (ROOT / words[1]).is_file()
    if words[:1] == ["trilm"] and len(words) > 1:
        return words[1] in COMMANDS
    if words[:1] == ["make"] and len(words) > 1:
        target = re.compile(rf"^{re.escape(words[1])}:", re.MULTILINE)
        return target.search((ROOT / "Makefile").read_text()) is not None
    return False


def test_every_evidence_folder_names_its_driver():
    """Each folder of docs/results/ names, in the index, the command that writes it, and that command
    exists: an experiment's driver, a trilm command, a make target or a script. An experiment's own page
    names its driver too, and every experiment has its folder."""
    drivers = _index_drivers()
    folders = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    assert sorted(drivers) == folders, f"index rows {sorted(drivers)}, folders {folders}"
    missing = [f"{name}: {c or 'no command'}" for name, (_, c) in drivers.items() if not _driver_exists(c)]
    assert not missing, f"folders whose driver does not exist: {missing}"
    for package in EXPERIMENT_PACKAGES:
        folder = package.name.replace("_", "-")
        assert folder in drivers, f"experiments/{package.name} has no folder docs/results/{folder}/"
        page, command = drivers[folder]
        assert command.startswith(f"python -m experiments.{package.name}"), (folder, command)
        assert f"python -m experiments.{package.name}" in (RESULTS / page).read_text(), (
            f"docs/results/{page} does not name python -m experiments.{package.name}"
        )


def _quoted_commands() -> set[str]:
    """Every ``python -m benchmarks…`` or ``python -m experiments…`` the reader is told to run: the pages,
    the READMEs, the command files and the modules' own docstrings (result files keep the command of their
    day)."""
    pages = [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "docs" / "results").rglob("*.sh"),
        *BENCH.rglob("README.md"),
        *MODULES,
        *EXPERIMENTS.rglob("README.md"),
        *EXPERIMENTS.rglob("*.sh"),
        *EXPERIMENTS.rglob("*.py"),
        *(ROOT / "configs").rglob("*.yaml"),
    ]
    command = re.compile(r"python -m ((?:benchmarks|experiments)(?:\.[a-z_]\w*)+)")
    return {m for page in pages for m in command.findall(page.read_text())}


def test_every_quoted_benchmark_command_exists():
    missing = sorted(m for m in _quoted_commands() if _module_of(m) is None)
    assert not missing, f"quoted commands with no module: {missing}"


def test_every_quoted_benchmark_or_experiment_file_exists():
    """A page that names a file of ``benchmarks/`` or ``experiments/`` (``experiments/ladder/commands.sh``)
    names one that exists; result files keep the paths of their day."""
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *BENCH.rglob("README.md")]
    pages += [*EXPERIMENTS.rglob("README.md"), *EXPERIMENTS.rglob("*.sh")]
    path = re.compile(r"(?<![\w/.])((?:benchmarks|experiments)/[\w/]+\.(?:py|sh))")
    missing = sorted(
        f"{page.relative_to(ROOT)}: {name}"
        for page in pages
        for name in path.findall(page.read_text())
        if not (ROOT / name).is_file()
    )
    assert not missing, f"quoted files that do not exist: {missing}"


def _documented_benchmarks() -> list[str]:
    return sorted(m for m in _quoted_commands() if _module_of(m) is not None)


def test_every_documented_benchmark_answers_help():
    """Every command the docs quote still parses its arguments, run as ``python -m`` runs it (one interpreter
    for all, so the sweep pays for importing torch once)."""
    modules = _documented_benchmarks()
    assert "benchmarks.kernels" in modules and "experiments.posthoc_real" in modules
    driver = (
        "import contextlib, io, json, runpy, sys\n"
        "failed = []\n"
        "for m in sys.argv[1:]:\n"
        "    out, code = io.StringIO(), None\n"
        "    sys.argv = [m, '--help']\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        "            runpy.run_module(m, run_name='__main__', alter_sys=True)\n"
        "    except SystemExit as stop:\n"
        "        code = stop.code\n"
        "    except BaseException as error:\n"
        "        code = repr(error)\n"
        "    if code not in (0, None) or 'usage:' not in out.getvalue():\n"
        "        failed.append(f'{m}: exit {code}: {out.getvalue()[-300:]}')\n"
        "print(json.dumps(failed))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", driver, *modules], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(failed)


IMPORT_REASON = re.compile(r"#\s*(optional dependency|deferred for start-up time|import cycle)\b")
"""What may keep an import inside a function: an optional dependency (an extra of pyproject.toml), a heavy
import deferred so that a light module or ``trilm CMD --help`` does not pay for it, or an import cycle."""


def _function_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        node
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]


def _says_why(node: ast.Import | ast.ImportFrom, lines: list[str], import_lines: set[int]) -> bool:
    """The reason is on the import's own lines, or in a comment above it or above the run of imports that
    belongs to (one comment for a function's group of imports with the same reason, blank lines between
    its sections included)."""
    if any(IMPORT_REASON.search(lines[i - 1]) for i in range(node.lineno, node.end_lineno + 1)):
        return True
    i = node.lineno - 1
    while i >= 1:
        text = lines[i - 1].strip()
        if text.startswith("#"):
            if IMPORT_REASON.search(text):
                return True
        elif text and i not in import_lines:
            return False
        i -= 1
    return False


def test_function_level_imports_say_why():
    """An import inside a function hides a module's dependencies from its top and is paid on every call:
    the library and its entry points import at the top, except where an optional dependency, start-up time
    or an import cycle needs otherwise, and the import says which (``# optional dependency: …``,
    ``# deferred for start-up time: …``, ``# import cycle: …``) on its line or in a comment above it."""
    offenders = []
    for path in _sources("trilm", "kernels", "train", "checkpoints_tools"):
        if path.resolve() != path:
            continue  # trilm/kernels, trilm/configs: links a checkout may hold to kernels/, configs/
        nodes = _function_imports(path)
        if not nodes:
            continue
        lines = path.read_text().splitlines()
        imports = [
            n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import | ast.ImportFrom)
        ]
        import_lines = {i for n in imports for i in range(n.lineno, n.end_lineno + 1)}
        offenders += [
            f"{path.relative_to(ROOT)}:{n.lineno}: {ast.unparse(n)}"
            for n in nodes
            if not _says_why(n, lines, import_lines)
        ]
    assert not offenders, "function-level imports without a reason comment:\n" + "\n".join(offenders)
