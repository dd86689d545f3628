"""Options that several ``trilm`` commands share, spelled and explained in one place.

Flags are a contract with scripts and docs: a command adds a shared option through one of these functions
rather than repeating its ``add_argument`` line, so that ``--no-progress``, ``--device``, ``--tokenizer`` or
``--bootstrap`` mean the same thing, with the same default and help, wherever they appear. Each function
takes a parser or an argument group. This module imports nothing heavy: the command modules load it at
start, before any of them imports torch.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol


class _AddsArguments(Protocol):
    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...


def add_no_progress(parser: _AddsArguments) -> None:
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_device(parser: _AddsArguments, *, help: str = "cpu (default) or cuda[:i]") -> None:
    parser.add_argument("--device", default="cpu", help=help)


def add_tokenizer(parser: _AddsArguments, *, type: Any = str, force: bool = True) -> None:
    """``--tokenizer`` for a model without its own tokenizer next to it, and ``--force-tokenizer`` to use
    one that the store's policy would refuse (another vocabulary or recorded hash)."""
    parser.add_argument(
        "--tokenizer",
        type=type,
        default=None,
        help="tokenizer.model or tokenizer.json (or a folder with one) when none is next to the model; "
        "checked to be the model's",
    )
    if force:
        parser.add_argument(
            "--force-tokenizer",
            action="store_true",
            help="use --tokenizer even where it does not look like the model's (hash or vocabulary differ)",
        )


def add_bootstrap(parser: _AddsArguments, *, resamples: int = 1000, seed: int = 0, note: str = "") -> None:
    """``--bootstrap`` resamples of a fit's intervals and the ``--seed`` that draws them."""
    extra = f" ({note})" if note else ""
    parser.add_argument(
        "--bootstrap", type=int, default=resamples, help=f"bootstrap resamples (0: none){extra}"
    )
    parser.add_argument("--seed", type=int, default=seed, help="bootstrap seed")


def add_size_axis(parser: _AddsArguments, *, default: str | None, help: str) -> None:
    """``--x``: the parameter count that a scaling law's size axis measures."""
    parser.add_argument("--x", choices=["params", "nonembedding_params"], default=default, help=help)
