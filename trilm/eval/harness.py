"""Running lm-evaluation-harness on trilm models, offline, with the tasks shipped in ``trilm/eval/tasks``.

In Python, :func:`run_lm_eval` evaluates a model path (or an opened :class:`~trilm.eval.model.EvalModel`)
with trilm's own lm-eval model. lm-eval's command line also works, with ``--model trilm`` registered::

    python -m trilm.eval.harness --model trilm --model_args pretrained=SNAPSHOT --tasks trilm_local

(the shipped task directory is added to ``--include_path`` automatically). ``trilm eval lm-eval`` is the
short form of the same thing.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import Any

from trilm.config import ConfigError

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
LOCAL_TASKS = ("trilm_cloze", "trilm_lastword", "trilm_rolling", "trilm_continue")


def _offline() -> None:
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(key, "1")


def run_lm_eval(
    model,
    tasks: list[str],
    *,
    limit: int | float | None = None,
    batch_size: int = 8,
    num_fewshot: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    packed: bool = False,
    include_path: list[str] | tuple[str, ...] = (),
    seed: int = 0,
) -> dict[str, Any]:
    """lm-eval results (``simple_evaluate``'s dict) of ``model`` on ``tasks`` with trilm's model class."""
    _offline()
    if limit is not None and not limit >= 0:
        raise ConfigError(f"--limit: must be >= 0 (0: all examples; below 1: a fraction), got {limit}")
    # deferred for start-up time: loads lm_eval and torch only when called
    from lm_eval import simple_evaluate

    from trilm.eval.lm_eval_model import TrilmLM

    manager = task_manager(tasks, include_path)
    lm = TrilmLM(pretrained=model, device=device, dtype=dtype, batch_size=batch_size, packed=packed)
    return simple_evaluate(
        model=lm,
        tasks=list(tasks),
        task_manager=manager,
        limit=limit,
        num_fewshot=num_fewshot,
        log_samples=False,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )


def task_manager(tasks: list[str], include_path: list[str] | tuple[str, ...] = ()):
    """lm-eval's task index with the shipped tasks, after checking that every name in ``tasks`` is known
    (unknown names are refused with the closest known ones, before any model is loaded)."""
    _offline()
    # deferred for start-up time: loads lm_eval and torch only when called
    from lm_eval.tasks import TaskManager

    shipped = {*LOCAL_TASKS, "trilm_local"}
    builtin = bool(include_path) or any(t not in shipped for t in tasks)  # indexing lm-eval's own takes ~30 s
    manager = TaskManager(include_path=[str(TASKS_DIR), *map(str, include_path)], include_defaults=builtin)
    check_tasks(tasks, manager)
    return manager


def check_tasks(tasks: list[str], manager) -> None:
    """Raise naming the task names ``manager`` does not know, with close matches."""

    known = list(manager.all_tasks)
    unknown = [t for t in tasks if t not in known and not manager.match_tasks([t])]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hints.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    raise ConfigError(
        f"--tasks: unknown lm-eval task(s) {'; '.join(hints)}; the shipped offline tasks are "
        f"{', '.join(LOCAL_TASKS)} (group trilm_local)"
    )


def metrics(results: dict[str, Any]) -> dict[str, float]:
    """``{"task/metric": value}`` for every numeric task metric (stderr and aliases dropped)."""
    out: dict[str, float] = {}
    for task, values in results.get("results", {}).items():
        for key, value in values.items():
            if "stderr" in key or key == "alias" or not isinstance(value, int | float):
                continue
            out[f"{task}/{key.split(',')[0]}"] = float(value)
    return out


def main(argv: list[str] | None = None) -> None:
    """lm-eval's own command line with ``--model trilm`` registered and the shipped tasks included."""
    _offline()
    # deferred for start-up time: loads lm_eval and torch only when called
    from lm_eval.__main__ import cli_evaluate

    import trilm.eval.lm_eval_model  # noqa: F401 - registers "trilm"

    args = list(sys.argv[1:] if argv is None else argv)
    if "--include_path" not in args:
        args += ["--include_path", str(TASKS_DIR)]
    sys.argv = ["lm-eval", *args]
    cli_evaluate()


if __name__ == "__main__":
    main()
