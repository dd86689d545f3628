"""``trilm quickstart`` (what ``make quickstart`` runs): the scaling story in minutes on a CPU.

It is the quickstart suite (``configs/suites/quickstart.yaml``) run end to end through ``trilm suite``:

1. tokenizer + packed shards of the embedded corpus,
2. TriLM, FloatLM and BiLM at four tiny sizes each, on the same tokens, with the Spectra schedule, every run
   writing its checkpoint suite (cheapest runs first, one single-threaded run per core at a time),
3. a generated sample from each family's largest model,
4. the analysis: the results table of every checkpoint; the final loss per size and family and whether it
   falls with size; L(N) = E + A/N^α per family, printed as a law only where the data identify it; L(D)
   along each run; the families compared at equal parameters and at equal size in bits; each run's final
   loss as forecast from its first half against the measured one, and as L(N) without its size predicts it
   (report and plots under ``<run-dir>/analysis``). The sizes, budget and rates are the CPU ladder's
   (``docs/results/ladder/``: the same story at five sizes, with the rate sweeps that chose them), and the
   family order at each size is checked against the ladder's.

Rerunning it reuses what is finished: prepared shards, completed runs (they are skipped; an interrupted one
resumes), rows already in the results table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from trilm.configs import packaged
from trilm.families import display_name

PROMPTS = ("In the beginning", "The Python interpreter")
LADDER = "docs/results/ladder/README.md (the CPU ladder in the trilm repository)"
LADDER_FINALS = "configs/reference/ladder-finals.json"


def build_parser(parser: argparse.ArgumentParser, command: str = "quickstart") -> None:
    parser.add_argument("--run-dir", default="runs/quickstart", help="where data, runs and analysis go")
    parser.add_argument(
        "--tokens", type=int, default=None, help="training tokens per run (default: the suite's budget)"
    )
    parser.add_argument(
        "--families", default="trilm,floatlm,bilm", help="comma-separated, from trilm,floatlm,bilm"
    )
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples of the fits")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs trained at once, each on one core (default: one per core, at most 4)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _samples(suite, tokenizer_path: Path) -> str:
    # deferred for start-up time: sentencepiece and yaml (keeps `trilm quickstart --help` fast)
    from trilm.data.tokenizer import Tokenizer

    # deferred for start-up time: torch and numpy (keeps `trilm quickstart --help` fast)
    from trilm.serve import Engine, SamplingParams
    from trilm.store.integrity import latest_complete

    tok = Tokenizer.load(tokenizer_path)
    params = SamplingParams(max_tokens=40, temperature=0.7, top_k=20, seed=0)
    largest = {}
    for run in suite.runs:
        largest[run.family] = run  # runs of a family come in size order
    out = []
    for run in largest.values():
        snapshot = latest_complete(run.run_dir / "snapshots")
        if snapshot is None:
            continue
        engine = Engine.load(snapshot[1], device="cpu", tokenizer=tok, max_batch=len(PROMPTS))
        for prompt, done in zip(PROMPTS, engine.generate(list(PROMPTS), params)):
            out.append(f"[{run.name}] {prompt}{done.text.replace(chr(10), ' ')}")
    return "\n".join(out)


class LadderCheck(NamedTuple):
    size: str
    agrees: bool
    text: str


def ladder_agreement(
    finals: dict[str, dict[str, Any]], reference: dict[str, Any] | None = None
) -> list[LadderCheck]:
    """Per size, the order of the families' final losses here against the CPU ladder's at the same size (the
    same corpus and tokenizer, each run at its best rate; by default the same budget): a shorter budget
    (``--tokens``) can reorder families, and the output must say so next to the numbers rather than state the
    order as a finding.
    ``finals`` is :func:`trilm.suite.analyse.final_losses`' table; ``reference`` the ladder's (default: the
    packaged ``configs/reference/ladder-finals.json``)."""
    if reference is None:
        reference = json.loads(packaged(LADDER_FINALS).read_text())["sizes"]
    # deferred for start-up time: torch and numpy (keeps `trilm quickstart --help` fast)
    from trilm.suite.analyse import ORDER
    from trilm.suite.text import si

    checks = []
    for size, entry in finals.items():
        ladder = reference.get(size, {})
        families = [f for f in ORDER if f in entry and f in ladder]
        if len(families) < 2:
            continue
        here = sorted(families, key=lambda f: entry[f])
        there = sorted(families, key=lambda f: ladder[f]["loss"])
        order = " < ".join(display_name(f) for f in here)
        figures = ", ".join(f"{display_name(f)} {ladder[f]['loss']:.4f}" for f in there)
        tokens = max(ladder[f]["tokens"] for f in families)
        if here == there:
            text = f"{size:<6} {order}: as in the ladder ({figures} at {si(tokens)} tokens)"
        else:
            text = (
                f"{size:<6} {order}: NOT the ladder's order {' < '.join(display_name(f) for f in there)}"
                f" ({figures} at {si(tokens)} tokens); this budget is too short to settle it"
            )
        checks.append(LadderCheck(size, here == there, text))
    return checks


def analysis_text(result) -> str:
    """What the quickstart prints of a :class:`trilm.suite.analyse.SuiteAnalysis`: the summary with the family
    order checked against the CPU ladder, then each finished run's predicted against measured final loss."""
    # deferred for start-up time: torch and numpy (keeps `trilm quickstart --help` fast)
    from trilm.suite.analyse import final_losses, summary_text
    from trilm.suite.predicted import text_lines

    checks = ladder_agreement(final_losses(result.report))
    heading = "family order by size (lowest loss first) against the CPU ladder:"
    after = ["", heading, *[c.text for c in checks]]
    differ = [c.size for c in checks if not c.agrees]
    caveat = (
        f"at {', '.join(differ)} the families are not in the CPU ladder's order (above): the fitted curves"
        " below describe this budget, not the families"
        if differ
        else None
    )
    text = summary_text(result.report, after_table=after if checks else [], comparison_caveat=caveat)
    if result.predictions is not None and result.predictions.rows:
        text += "\n\n" + "\n".join(text_lines(result.predictions))
    return text


def run(args) -> int:
    # deferred for start-up time: torch and numpy (keeps `trilm quickstart --help` fast)
    from trilm.suite import load_suite
    from trilm.suite.analyse import analyse_suite
    from trilm.suite.launch import cheapest_first, launch_local, prepare_data

    start = time.perf_counter()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    suite = load_suite(
        "quickstart", families=families, root=args.run_dir, tokens=[args.tokens] if args.tokens else None
    )
    root = suite.root
    progress = not args.no_progress
    print(f"== 1/4 data: tokenizer and packed shards of the embedded corpus → {root / 'data'}")
    prepare_data(suite, progress)
    sizes = ", ".join(dict.fromkeys(r.size for r in suite.runs))
    jobs = args.jobs or max(1, min(os.cpu_count() or 1, 4))
    print(
        f"== 2/4 train {len(suite.runs)} runs ({', '.join(families)} × {sizes};"
        f" {suite.runs[0].cfg.steps} steps of {suite.runs[0].cfg.batch_tokens:,} tokens each,"
        f" {jobs} at a time) → {root}"
    )
    outcomes = launch_local(suite, cheapest_first(suite.runs), progress=progress, jobs=jobs)
    failed = [o for o in outcomes if o.action == "failed"]
    if failed:
        print(f"quickstart: {len(failed)} run(s) failed: " + "; ".join(str(o) for o in failed))
        return 1
    print(f"== 3/4 samples from each family's largest model ({', '.join(PROMPTS)})")
    print(_samples(suite, root / "data" / "tokenizer.model"))
    print(f"== 4/4 analysis: every checkpoint → results table → L(N) fits, family comparison → {root}")
    result = analyse_suite(suite, bootstrap=args.bootstrap, seed=0)
    print(analysis_text(result))
    print(f"\nreport {result.summary_file}, {result.out_dir / 'report.md'}; plots in {result.out_dir}")
    print(f"the same story at five sizes, with the pilots and rate sweeps that chose this recipe: {LADDER}")
    runs = " ".join(str(r.run_dir) for r in suite.runs)
    print("next: export every checkpoint (HF with tokenizer, packed, GGUF, model cards) and evaluate them:")
    print(f"  trilm export suite {runs} --out {root / 'suite'}")
    validation = root / "data" / "validation"
    print(f"  trilm eval suite {root / 'suite'} --table {root / 'eval.csv'} --data {validation} "
          "--max-tokens 32768 --tasks trilm_local --limit 20")  # fmt: skip
    print(f"quickstart finished in {time.perf_counter() - start:.0f} s; runs, logs and analysis under {root}")
    return 0
