"""Throw-away virtual environments for the packaging tests: trilm's wheel, built once, installed on top of
the dependencies this environment already has.

A new venv gets a ``.pth`` file naming every site-packages directory this interpreter imports from, so
torch, megatron-core and the rest are reused as installed (no index, no download); trilm itself comes only
from the wheel, because the editable install's import hook sits in a ``.pth`` file that a path listed in
another ``.pth`` does not run.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


WHEEL_SOURCES = ("pyproject.toml", "README.md", "trilm", "kernels", "configs")
"""What the wheel is built from (pyproject's package-dir roots and metadata files)."""


def build_wheel(out: Path) -> Path:
    """``pip wheel --no-deps --no-build-isolation .`` into ``out``; the wheel's path (what the build
    printed is kept beside it, ``build.log``). Built from a copy of the sources: setuptools builds in the
    source tree, and a ``build/`` left there by an earlier build would carry modules since deleted into
    this wheel."""
    source = out / "source"
    source.mkdir(parents=True)
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out)]
    done = subprocess.run([*cmd, str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (out / "build.log").write_text(done.stdout + done.stderr)
    (wheel,) = out.glob("trilm-*.whl")
    return wheel


def _site_dirs() -> list[str]:
    dirs = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    return list(dict.fromkeys([*dirs, *site.getsitepackages()]))


@dataclasses.dataclass
class Venv:
    root: Path
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def tool(self, name: str) -> str:
        return str(self.root / "bin" / name)

    @property
    def purelib(self) -> str:
        code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        return subprocess.run(
            [self.python, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()

    def run(self, cmd: list[str], cwd: Path, timeout: float = 900) -> str:
        """Run ``cmd`` in this environment from ``cwd``; its stdout, or an assertion naming what failed."""
        out = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, (
            f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
        return out.stdout

    def pip(self, *args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
        cmd = [self.python, "-m", "pip", "--disable-pip-version-check", *args]
        return subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)


def layered_venv(root: Path, wheel: Path | None = None) -> Venv:
    """A venv at ``root`` that reuses this environment's packages, with ``wheel`` installed in it."""
    venv.EnvBuilder(with_pip=False).create(root)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env |= {"PATH": f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}", "TOKENIZERS_PARALLELISM": "false"}
    made = Venv(root, env)
    Path(made.purelib, "zz-reuse-installed.pth").write_text("\n".join(_site_dirs()) + "\n")
    if wheel is not None:
        done = made.pip(
            "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel), cwd=root
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return made
