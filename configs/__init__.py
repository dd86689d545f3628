"""trilm's packaged configs: run configs (``train/``), named suites (``suites/``) and launch scripts.

This is the repository's top-level ``configs/`` folder, installed as the package ``trilm.configs``
(``package-dir`` in pyproject.toml), so a wheel carries them and ``trilm suite plan spectra`` works from any
directory. Code finds them through :func:`config_dir` (importlib.resources), never through a path relative
to a checkout; in an editable install that is the checkout's ``configs/`` itself.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path, PurePath


def config_dir() -> Path:
    """The installed ``configs/`` folder (a real directory: launch scripts are run from it)."""
    root = files(__name__)
    if not isinstance(root, Path):
        raise RuntimeError(
            f"trilm.configs is inside an archive ({root}); install trilm as a regular package (pip install)"
        )
    return root


def packaged(path: str | PurePath) -> Path:
    """A repository-relative config path (``configs/train/x.yaml``, or ``train/x.yaml``) in the installed
    folder; whether it exists is the caller's question."""
    parts = PurePath(path).parts
    if parts and parts[0] == "configs":
        parts = parts[1:]
    return config_dir().joinpath(*parts)
