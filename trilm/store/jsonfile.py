"""Reading the JSON files of a model directory, below every store module that reads one.

Its own module so that the tokenizer policy and the snapshot writer, which call each other's
neighbours, can both read JSON without importing one another."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trilm.store.errors import StoreError


def read_json(path: Path, hint: str = "") -> Any:
    """The JSON content of a file of a model directory; a missing or unreadable file is named."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise StoreError(f"{path}: not found{hint}") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: UnicodeDecodeError and JSON errors
        raise StoreError(f"{path}: invalid JSON: {type(exc).__name__}: {exc}") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object file ({} when absent, or when it holds something else)."""
    data = read_json(path) if path.is_file() else {}
    return data if isinstance(data, dict) else {}
