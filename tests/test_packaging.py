"""What ``pip install`` gives a user: the package list matches the folders, and a built wheel runs outside
the repository.

The wheel test builds trilm's wheel, installs it into a throw-away virtual environment that reuses this
environment's installed dependencies (a ``.pth`` file naming their site-packages: no index, no download),
and runs the commands a user runs first from an empty directory: the quickstart at a shortened budget, a
named suite's plan, a suite launch dry run, training a packaged run config with ``trilm train`` and
``python -m trilm.train``. It is what a checkout-relative path (``configs/``, ``train/pretrain.py``) or a
package missing from pyproject's explicit list would break.
"""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.venvs import Venv, layered_venv

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> tuple[list[str], dict[str, str]]:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return tool["packages"], tool["package-dir"]


CHECKOUT_ONLY = ("trilm.testing",)
"""The loopback cluster the tests and the multi-node drills launch from the checkout (it locates the
checkout's ``train/pretrain.py``), so no wheel holds it."""


def _is_under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_package_list_is_every_folder_with_an_init():
    """pyproject lists packages (a folder mapped through package-dir is invisible to ``find``): every
    package folder under the mapped roots is listed, and every listed package exists, except
    :data:`CHECKOUT_ONLY`, which the wheel must not carry."""
    packages, roots = _declared()
    on_disk = set()
    for name, folder in roots.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if any(part.startswith((".", "__")) for part in rel.parts):
                continue
            dotted = ".".join((name, *rel.parts))
            # a folder mapped to its own name (trilm.kernels → kernels/) belongs to that mapping only
            owner = max((n for n in roots if dotted == n or dotted.startswith(n + ".")), key=len)
            if owner == name and not any(_is_under(dotted, c) for c in CHECKOUT_ONLY):
                on_disk.add(dotted)
    assert sorted(on_disk) == sorted(packages)
    assert not [p for p in packages if any(_is_under(p, c) for c in CHECKOUT_ONLY)]


def test_the_wheel_builds_quietly_with_its_data(trilm_wheel):
    """``make install`` prints its steps and nothing else: the build warns about nothing (a data folder
    such as ``data/corpus/train/chunk1`` looks like an unlisted package to setuptools unless the package
    data is declared exactly), and the declared data is all in the wheel."""
    assert (trilm_wheel.parent / "build.log").read_text() == ""
    names = set(zipfile.ZipFile(trilm_wheel).namelist())
    for wanted in (
        "trilm/data/corpus/train/chunk1/",
        "trilm/data/corpus/validation/chunk1/",
        "trilm/eval/tasks/",
        "trilm/scaling/data/",
        "trilm/configs/suites/spectra.yaml",
        "trilm/configs/train/trilm-99m.yaml",
        "trilm/configs/launch/",
        "trilm/configs/reference/ladder-finals.json",
        "trilm/kernels/affine/",
        "trilm/kernels/general/",
        "trilm/py.typed",
    ):
        assert any(name.startswith(wanted) for name in names), wanted
    # the checkout-only folders (benchmarks/, experiments/, tests/) stay out of the wheel
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"trilm"}, sorted(tops)
    assert not any(name.startswith("trilm/testing/") for name in names)  # the loopback cluster: checkout-only


@pytest.fixture(scope="module")
def wheel_venv(trilm_wheel, tmp_path_factory) -> Venv:
    return layered_venv(tmp_path_factory.mktemp("wheel-venv") / "venv", trilm_wheel)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # six commands in fresh processes; about 4 minutes on a quiet 2-core machine
def test_the_wheel_runs_outside_the_repository(wheel_venv, tmp_path):
    python, run = wheel_venv.python, wheel_venv.run
    here = tmp_path / "elsewhere"
    here.mkdir()
    trilm = wheel_venv.tool("trilm")

    where = run(
        [
            python,
            "-c",
            "import trilm, trilm.configs, trilm.kernels; print(trilm.__file__); "
            "print(trilm.configs.config_dir()); print(trilm.kernels.__file__)",
        ],
        here,
    ).split()
    venv_root = str(wheel_venv.root)
    assert all(p.startswith(venv_root) for p in where), where  # the wheel's copy, not the checkout
    assert str(ROOT) not in " ".join(where)

    plan = run([trilm, "suite", "plan", "spectra"], here)
    assert "suite spectra (configs/suites/spectra.yaml)" in plan and "trilm-3.9b" in plan

    dry = run([trilm, "suite", "launch", "quickstart", "--dry-run", "--run-dir", "qs"], here)
    assert "would train" in dry and "trilm train --config" in dry
    assert (here / "qs" / "configs" / "trilm-128x4.yaml").is_file()

    data = run([trilm, "data", "embedded", "--out", "data", "--vocab-size", "512"], here)
    assert (here / "data" / "train").is_dir(), data
    packaged = run(
        [
            python,
            "-c",
            "from trilm.configs import packaged; print(packaged('configs/train/quickstart-trilm.yaml'))",
        ],
        here,
    ).strip()
    assert packaged.startswith(venv_root)
    overrides = [
        "model.vocab_size=512",
        "data.train_dir=data/train",
        "data.valid_dir=data/validation",
        "data.tokenizer=data/tokenizer.model",
        "seq_len=64",
        "batch_tokens=512",
        "micro_batch=8",
        "tokens=1536",
        "log.progress=false",
        "log.tensorboard=false",
        "data.valid_sequences=8",
    ]
    trained = run([trilm, "train", "--config", packaged, "run_dir=run-a", *overrides], here)
    assert (here / "run-a" / "snapshots" / "step-3" / "COMPLETE").is_file(), trained
    module = run([python, "-m", "trilm.train", "--config", packaged, "run_dir=run-b", *overrides], here)
    assert (here / "run-b" / "snapshots" / "step-3" / "COMPLETE").is_file(), module

    quick = [trilm, "quickstart", "--run-dir", "quick", "--families", "trilm", "--tokens", "2048"]
    out = run([*quick, "--bootstrap", "10", "--jobs", "1", "--no-progress"], here)
    assert "== 4/4 analysis" in out and "quickstart finished" in out
    assert (here / "quick" / "results.csv").is_file() and (here / "quick" / "analysis" / "fit.json").is_file()
    assert not list(ROOT.glob("quick")) and not (ROOT / "run-a").exists()
