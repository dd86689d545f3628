"""A guard for tests of code that must treat its input as data: inside :func:`no_files_opened`, opening a
file (``open``, ``io.open``, ``os.open``, ``Path.open``/``read_text``/``read_bytes``) raises, unless
``allowed`` admits the path."""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any


class FileOpened(AssertionError):
    """Code under :func:`no_files_opened` opened a file it was not allowed to."""


@contextlib.contextmanager
def no_files_opened(allowed: Callable[[pathlib.Path], bool] | None = None) -> Iterator[set[pathlib.Path]]:
    """Forbid opening files for the ``with`` block; yields the set of allowed paths that were opened.

    Python's own imports read source through ``io.open_code``, which stays open, so a function-level
    import inside the block still works.
    """
    opened: set[pathlib.Path] = set()
    real_open, real_os_open = builtins.open, os.open
    real_path = {name: getattr(pathlib.Path, name) for name in ("open", "read_text", "read_bytes")}

    def check(target: Any) -> None:
        path = pathlib.Path(os.fsdecode(target)) if isinstance(target, str | bytes | os.PathLike) else None
        if path is None or allowed is None or not allowed(path):
            raise FileOpened(f"opened {target!r}, inside a block that must open no file")
        opened.add(path)

    def guarded_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        check(file)
        return real_open(file, *args, **kwargs)

    def guarded_os_open(path: Any, *args: Any, **kwargs: Any) -> int:
        check(path)
        return real_os_open(path, *args, **kwargs)

    def guarded_path(name: str) -> Callable[..., Any]:
        def method(self: pathlib.Path, *args: Any, **kwargs: Any) -> Any:
            check(self)  # the real method opens through io.open, which checks again
            return real_path[name](self, *args, **kwargs)

        return method

    patches: list[tuple[Any, str, Any]] = [
        (builtins, "open", guarded_open),
        (io, "open", guarded_open),
        (os, "open", guarded_os_open),
        *((pathlib.Path, name, guarded_path(name)) for name in real_path),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield opened
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
