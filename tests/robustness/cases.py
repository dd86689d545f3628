"""The catalogue: every ``trilm`` command × bad inputs, and what a safe answer is.

Pure data (no trilm import), so the same catalogue runs against any checkout (``table.py``). Paths use
``{F}`` (the fixture tree of :mod:`tests.robustness.fixtures`, never to change) and ``{W}`` (the case's own
empty work directory, where outputs go). ``expect`` and ``refuse`` are regular expressions searched in
what the command prints; ``absent`` are globs under ``{W}`` that must not exist afterwards; ``portable``
are outputs (globs under ``{W}``) that must not contain the fixture tree's absolute path.

``defect`` ties a case to the numbered defects of issue 19 (``1``–``6``) for the before → after table;
the rest are the general catalogue the issue asks for (every command × bad inputs).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    expect: tuple[str, ...] = ()
    exit: int = 2
    refuse: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    portable: tuple[str, ...] = ()
    setup: str | None = None
    files: tuple[tuple[str, str], ...] = ()
    """(path under {W}, content) written before the command runs."""
    copies: tuple[tuple[str, str], ...] = ()
    """(fixture, path under {W}) copied before the command runs; protected (must stay byte-identical)."""
    protect: tuple[str, ...] = ()
    """More paths under {W} (made by ``setup``) that must stay byte-identical."""
    defect: str = ""
    note: str = ""

    @property
    def protect_work(self) -> tuple[str, ...]:
        return tuple(dst for _, dst in self.copies) + self.protect


def args(*parts: str) -> tuple[str, ...]:
    """A command line written as words: each part is split on spaces (no argument here holds one)."""
    return tuple(word for part in parts for word in part.split())


# ---- the model directories the fixtures hold (see fixtures.py) -------------------------------------------
SNAP = "{F}/float/snapshots/step-10"
BAD_MODELS: dict[str, tuple[str, str, str]] = {
    # name: (model path, run directory for suite commands, what the message must name)
    "truncated": ("{F}/truncated/snapshots/step-10", "{F}/truncated", r"model\.safetensors"),
    "bit-flipped": ("{F}/flipped/snapshots/step-10", "{F}/flipped", r"model\.safetensors"),
    "no COMPLETE": ("{F}/unfinished/snapshots/step-10", "{F}/unfinished", r"COMPLETE"),
    "foreign tokenizer": ("{F}/foreign-tok", "{F}/foreign-tok", r"tokenizer"),
    "non-finite weight": ("{F}/nonfinite", "{F}/nonfinite", r"layers\.0\.mlp\.w_up\.weight"),
    "truncated, no manifest": ("{F}/loose-truncated", "{F}/loose-truncated", r"model\.safetensors"),
    "a run directory": ("{F}/float", None, r"/float\b"),
    "a data split": ("{F}/split", "{F}/split", r"/split\b"),
    "a file": ("{F}/text.txt", "{F}/text.txt", r"text\.txt"),
    "nothing there": ("{F}/missing", "{F}/missing", r"missing"),
}
BAD_HF: dict[str, tuple[str, str]] = {
    "HF truncated": ("{F}/hf-truncated", r"model\.safetensors"),
    "HF foreign tokenizer": ("{F}/hf-foreign", r"tokenizer"),
    "HF tokenizer larger than model": ("{F}/hf-plain", r"tokenizer"),
}
PRUNE = ("--method", "magnitude", "--granularity", "channel")
CALIB = ("--calib", "{F}/text.txt", "--samples", "4", "--seq-len", "32")

COMMANDS: dict[str, tuple[str, ...]] = {
    "quantize": args(
        "quantize {M} --method rtn --bits 4 --group-size 32", *CALIB, "--out {W}/out --no-progress"
    ),
    "export hf": ("export", "hf", "{M}", "{W}/out"),
    "export gguf": ("export", "gguf", "{M}", "{W}/out.gguf", "--type", "f16"),
    "export suite": ("export", "suite", "{R}", "--out", "{W}/suite", "--no-progress"),
    "eval ppl": args("eval ppl {M} --data {F}/text.txt --seq-len 32 --max-tokens 256 --no-progress"),
    "eval suite": args(
        "eval suite {R} --table {W}/t.csv --data {F}/text.txt --seq-len 32 --max-tokens 256 --no-progress"
    ),
    "eval lm-eval": ("eval", "lm-eval", "{M}", "--tasks", "trilm_cloze", "--limit", "1"),
    "generate": ("generate", "--model", "{M}", "--prompt", "In the beginning", "--max-tokens", "2"),
    "serve": ("serve", "--model", "{M}"),
    "prune": ("prune", "{M}", *PRUNE, "--keep", "0.5", "--out", "{W}/out", "--no-progress"),
    "train": ("train", "--config", "{W}/train.yaml", "--dry-run"),
}
TRAIN_YAML = """run_dir: {W}/run
init_from: {M}
data:
  train_dir: {F}/split
  tokenizer: {F}/tok/tokenizer.model
seq_len: 32
tokens: 4096
batch_tokens: 1024
micro_batch: 8
"""
OUTPUTS = ("out", "out.gguf", "out.gguf.json", "suite", "run")


def _model_cases() -> list[Case]:
    cases = []
    for command, template in COMMANDS.items():
        for name, (model, run, named) in BAD_MODELS.items():
            if run is None and "{R}" in template:
                continue
            argv = tuple(a.replace("{M}", model).replace("{R}", run or model) for a in template)
            files = (("train.yaml", TRAIN_YAML.replace("{M}", model)),) if command == "train" else ()
            defect = "1" if name == "bit-flipped" and command in ("eval ppl", "quantize", "generate") else ""
            if name in ("truncated", "truncated, no manifest") and command in ("quantize", "eval ppl"):
                defect = "4"
            if name == "non-finite weight" and command == "quantize":
                defect = "4"
            cases.append(
                Case(
                    id=f"{command} | {name}",
                    argv=argv,
                    expect=(named,),
                    absent=OUTPUTS,
                    files=files,
                    defect=defect,
                )
            )
    for command in ("quantize", "export hf", "eval ppl", "generate", "prune"):
        for name, (model, named) in BAD_HF.items():
            argv = tuple(a.replace("{M}", model) for a in COMMANDS[command])
            cases.append(Case(id=f"{command} | {name}", argv=argv, expect=(named,), absent=OUTPUTS))
    for name, (model, named) in {**BAD_HF, "a trilm snapshot": (SNAP, "trilm")}.items():
        defect = "3" if name in ("HF foreign tokenizer", "HF tokenizer larger than model") else ""
        if name == "HF truncated":
            defect = "4"
        cases.append(
            Case(
                id=f"import hf | {name}",
                argv=("import", "hf", model, "{W}/out"),
                expect=(named,),
                absent=OUTPUTS,
                defect=defect,
            )
        )
    return cases


def _kind_cases() -> list[Case]:
    """Models of the wrong kind for the command."""
    return [
        Case(
            "quantize | a TriLM",
            args(
                "quantize {F}/trilm/snapshots/step-10 --method rtn --bits 4 --group-size 32",
                *CALIB,
                "--out {W}/out",
            ),
            (r"trilm", r"float"),
            absent=OUTPUTS,
        ),
        Case(
            "quantize | a QuantLM",
            args("quantize {F}/quantlm --method rtn --bits 4 --group-size 32", *CALIB, "--out {W}/out"),
            (r"packed",),
            absent=OUTPUTS,
        ),
        Case(
            "prune | a QuantLM",
            ("prune", "{F}/quantlm", *PRUNE, "--keep", "0.5", "--out", "{W}/out"),
            (r"packed",),
            absent=OUTPUTS,
        ),
        Case(
            "export packed | truncated TriLM",
            ("export", "packed", "{F}/trilm-truncated/snapshots/step-10", "{W}/out"),
            (r"model\.safetensors",),
            absent=OUTPUTS,
        ),
        Case(
            "export packed | bit-flipped TriLM",
            ("export", "packed", "{F}/trilm-flipped/snapshots/step-10", "{W}/out"),
            (r"model\.safetensors",),
            absent=OUTPUTS,
        ),
        Case(
            "export packed | a FloatLM", ("export", "packed", SNAP, "{W}/out"), (r"FloatLM",), absent=OUTPUTS
        ),
        Case(
            "export gguf tq2_0 | a FloatLM",
            ("export", "gguf", SNAP, "{W}/out.gguf", "--type", "tq2_0"),
            (r"FloatLM",),
            absent=OUTPUTS,
        ),
        Case(
            "export hf | a pruned model",
            ("export", "hf", "{F}/pruned", "{W}/out"),
            (r"per-layer",),
            absent=OUTPUTS,
        ),
        Case(
            "export gguf | truncated QuantLM",
            ("export", "gguf", "{F}/quantlm-truncated", "{W}/out.gguf"),
            (r"packed\.safetensors",),
            absent=OUTPUTS,
        ),
        Case(
            "eval ppl | truncated QuantLM",
            args(
                "eval ppl {F}/quantlm-truncated --data {F}/text.txt",
                "--seq-len 32 --max-tokens 128 --no-progress",
            ),
            (r"packed\.safetensors",),
        ),
        Case(
            "generate | truncated QuantLM",
            ("generate", "--model", "{F}/quantlm-truncated", "--prompt", "x"),
            (r"packed\.safetensors",),
        ),
        Case(
            "train | init_from a QuantLM",
            ("train", "--config", "{W}/train.yaml", "--dry-run"),
            (r"packed",),
            files=(("train.yaml", TRAIN_YAML.replace("{M}", "{F}/quantlm")),),
            absent=OUTPUTS,
        ),
        Case(
            "eval ppl | data tokenized with another tokenizer",
            ("eval", "ppl", SNAP, "--data", "{F}/split-foreign", "--no-progress"),
            (r"split-foreign", r"tokenizer"),
        ),
        Case(
            "eval ppl | --tokenizer of another model",
            args(
                "eval ppl", SNAP, "--data {F}/text.txt --tokenizer {F}/foreign/tokenizer.model --no-progress"
            ),
            (r"tokenizer",),
        ),
        Case(
            "generate | --tokenizer of another model",
            ("generate", "--model", SNAP, "--prompt", "x", "--tokenizer", "{F}/foreign/tokenizer.model"),
            (r"tokenizer",),
        ),
        Case(
            "quantize | --tokenizer of another model",
            args(
                "quantize",
                SNAP,
                "--method rtn --bits 4 --group-size 32",
                *CALIB,
                "--tokenizer {F}/foreign/tokenizer.model --out {W}/out",
            ),
            (r"tokenizer",),
            absent=OUTPUTS,
        ),
    ]


def _number_cases() -> list[Case]:
    """Numbers out of range, named by their option."""
    q = ("quantize", SNAP, "--method", "rtn", "--out", "{W}/out", "--calib", "{F}/text.txt")
    g = ("quantize", SNAP, "--method", "gptq", "--out", "{W}/out", "--calib", "{F}/text.txt")  # reads data
    return [
        Case("quantize | --bits 7", (*q, "--bits", "7", "--group-size", "32"), (r"bits",), absent=OUTPUTS),
        Case(
            "quantize | --group-size 0",
            (*q, "--bits", "4", "--group-size", "0"),
            (r"group.size",),
            absent=OUTPUTS,
        ),
        Case(
            "quantize | --samples 0",
            (*g, "--bits", "4", "--group-size", "32", "--samples", "0"),
            (r"samples",),
            absent=OUTPUTS,
        ),
        Case(
            "quantize | --seq-len beyond the context",
            (*g, "--bits", "4", "--group-size", "32", "--seq-len", "100000"),
            (r"seq_len|seq-len",),
            absent=OUTPUTS,
        ),
        Case(
            "prune | --keep 1.5",
            ("prune", SNAP, *PRUNE, "--keep", "1.5", "--out", "{W}/out"),
            (r"keep",),
            absent=OUTPUTS,
        ),
        Case(
            "prune | --keep 0",
            ("prune", SNAP, *PRUNE, "--keep", "0", "--out", "{W}/out"),
            (r"keep",),
            absent=OUTPUTS,
        ),
        Case(
            "eval ppl | --seq-len beyond the context",
            ("eval", "ppl", SNAP, "--data", "{F}/text.txt", "--seq-len", "100000", "--no-progress"),
            (r"seq.len",),
        ),
        Case(
            "eval ppl | --batch-size 0",
            ("eval", "ppl", SNAP, "--data", "{F}/text.txt", "--batch-size", "0", "--no-progress"),
            (r"batch.size",),
        ),
        Case(
            "eval ppl | --stride -1",
            ("eval", "ppl", SNAP, "--data", "{F}/text.txt", "--stride", "-1", "--no-progress"),
            (r"stride",),
        ),
        Case(
            "eval lm-eval | --limit -1",
            ("eval", "lm-eval", SNAP, "--tasks", "trilm_cloze", "--limit", "-1"),
            (r"limit",),
        ),
        Case(
            "generate | --temperature -1",
            ("generate", "--model", SNAP, "--prompt", "x", "--temperature", "-1"),
            (r"temperature",),
        ),
        Case(
            "generate | --max-tokens 0",
            ("generate", "--model", SNAP, "--prompt", "x", "--max-tokens", "0"),
            (r"max.tokens",),
        ),
        Case(
            "generate | --top-p 2",
            ("generate", "--model", SNAP, "--prompt", "x", "--top-p", "2"),
            (r"top.p",),
        ),
        Case("serve | --port 70000", ("serve", "--model", SNAP, "--port", "70000"), (r"port",)),
        Case(
            "train | tokens=-1",
            ("train", "--config", "{W}/train.yaml", "--dry-run", "tokens=-1"),
            (r"tokens",),
            files=(("train.yaml", TRAIN_YAML.replace("{M}", SNAP)),),
            absent=OUTPUTS,
        ),
        Case(
            "data tokenizer | --vocab-size 10",
            ("data", "tokenizer", "--input", "{F}/corpus", "--out", "{W}/tok", "--vocab-size", "10"),
            (r"vocab",),
            absent=("tok/*.model",),
        ),
        Case("model info | unknown preset", ("model", "info", "--preset", "trilm-7b"), (r"trilm-7b",)),
        Case(
            "scaling fit | a table that is not one",
            ("scaling", "fit", "{F}/text.txt", "--out", "{W}/fit"),
            (r"text\.txt",),
            absent=("fit",),
        ),
    ]


def _output_cases() -> list[Case]:
    """Outputs that already exist: nothing already there may be lost."""
    notes = (("notes", "out"),)
    return [
        Case(
            "export hf | into a folder of other files",
            ("export", "hf", SNAP, "{W}/out"),
            (r"out",),
            copies=notes,
        ),
        Case(
            "export packed | into a folder of other files",
            ("export", "packed", "{F}/trilm/snapshots/step-10", "{W}/out"),
            (r"out",),
            copies=notes,
        ),
        Case(
            "export gguf | onto a file that is not an export",
            ("export", "gguf", SNAP, "{W}/out.gguf", "--type", "f16"),
            (r"out\.gguf",),
            copies=(("notes.gguf", "out.gguf"),),
        ),
        Case(
            "export suite | into a folder of other files",
            ("export", "suite", "{F}/float", "--out", "{W}/out", "--no-gguf", "--no-progress"),
            (r"out",),
            copies=notes,
            defect="5",
            note="docs say refused",
        ),
        Case(
            "quantize | into a folder of other files",
            args("quantize", SNAP, "--method rtn --bits 4 --group-size 32", *CALIB, "--out {W}/out"),
            (r"out",),
            copies=notes,
        ),
        Case(
            "prune | into a folder of other files",
            ("prune", SNAP, *PRUNE, "--keep", "0.5", "--out", "{W}/out"),
            (r"out",),
            copies=notes,
        ),
        Case(
            "import hf | into a folder of other files",
            ("import", "hf", "{F}/hf", "{W}/out"),
            (r"out",),
            copies=notes,
        ),
        Case(
            "data prepare | --out is a file",
            args(
                "data prepare --input {F}/corpus --split validation",
                "--tokenizer {F}/tok/tokenizer.model --out {W}/out.gguf",
            ),
            (r"out\.gguf",),
            copies=(("notes.gguf", "out.gguf"),),
        ),
    ]


def _defect_cases() -> list[Case]:
    """The issue's measured defects that are not a bad model directory."""
    return [
        Case(
            "export gguf f16 | a weight beyond fp16 (GGUF would hold inf)",
            ("export", "gguf", "{F}/huge", "{W}/out.gguf", "--type", "f16"),
            (r"layers\.0\.mlp\.w_down|blk\.0\.ffn_down", r"fp16"),
            absent=("out.gguf", "out.gguf.json"),
            defect="2",
        ),
        Case(
            "export gguf q8_0 | a weight beyond fp16 scales",
            ("export", "gguf", "{F}/huger", "{W}/out.gguf", "--type", "q8_0"),
            (r"ffn_down|w_down", r"fp16"),
            absent=("out.gguf", "out.gguf.json"),
            defect="2",
        ),
        Case(
            "eval lm-eval | unknown task arc_eazy",
            ("eval", "lm-eval", SNAP, "--tasks", "arc_eazy", "--limit", "1"),
            (r"arc_eazy", r"arc_easy"),
            defect="4",
        ),
        Case(
            "data prepare | --include-source a source the corpus lacks",
            args(
                "data prepare --input {F}/corpus --split validation --tokenizer {F}/tok/tokenizer.model",
                "--out {W}/split --include-source RedPajamaArXiv --no-progress",
            ),
            (r"RedPajamaArXiv",),
            absent=("split/index.json",),
            defect="5",
        ),
        Case(
            "suite launch | changed suite file on a finished suite",
            ("suite", "launch", "{W}/suite/toy.yaml", "--local", "--dry-run"),
            (r"tokens", r"floatlm-pico"),
            setup="changed_suite",
            protect=("suite/runs",),  # with runs/configs, the launch's configs
            defect="5",
            note="finished run's configs/*.yaml kept",
        ),
        Case(
            "suite launch | --force on a finished suite",
            ("suite", "launch", "{W}/suite/toy.yaml", "--local", "--force"),
            (r"floatlm-pico\s+skipped: finished",),
            exit=0,
            refuse=(r"trained|failed",),
            setup="finished_suite",
            protect=("suite/runs",),  # with runs/configs, the launch's configs
            defect="5",
            note="no FAILED, no rewritten config in the finished run",
        ),
        Case(
            "suite launch | relaunch right after kill -9",
            ("suite", "launch", "{W}/suite/toy.yaml", "--local", "--dry-run"),
            (r"would train.*resumes from step 2",),
            exit=0,
            refuse=(r"running elsewhere",),
            setup="stale_lock",
            defect="5",
        ),
        Case(
            "quantize | rerun after a kill -9 while writing",
            args(
                "quantize", SNAP, "--method rtn --bits 4 --group-size 32", *CALIB, "--out {W}/q --no-progress"
            ),
            (r"wrote",),
            exit=0,
            absent=(".q.*", ".tmp-q*"),
            setup="killed_quantize",
            defect="5",
        ),
        Case(
            "export suite | a checkpoint that fails half-way",
            ("export", "suite", "{F}/pruned", "--out", "{W}/suite", "--no-progress"),
            (r"per-layer",),
            absent=("suite",),
            defect="5",
            note="no empty run folder left",
        ),
        Case(
            "export gguf | no machine path in the file",
            ("export", "gguf", SNAP, "{W}/out.gguf", "--type", "f16"),
            (r"wrote",),
            exit=0,
            portable=("out.gguf", "out.gguf.json"),
            defect="6",
        ),
        Case(
            "export hf | no machine path in the export",
            ("export", "hf", SNAP, "{W}/out"),
            (r"wrote",),
            exit=0,
            portable=("out",),
            defect="6",
        ),
        Case(
            "export suite | no machine path in the suite",
            ("export", "suite", "{F}/trilm", "--out", "{W}/suite", "--no-progress"),
            (r"checkpoints written",),
            exit=0,
            portable=("suite",),
            defect="6",
        ),
    ]


TABLE_HEADER = (
    "run,family,size,params,nonembedding_params,linear_params,tokens,flops,bits_per_param,step,eval,loss\n"
)


def _file_cases() -> list[Case]:
    """Damaged files besides models, one per reader (the Hypothesis tests listed in docs/robustness.md fuzz
    each reader itself): a results table, a run config, a suite file, a split's index, a manifest."""
    return [
        Case(
            "eval suite | a results table cut mid-row",
            tuple(a.replace("{R}", "{F}/float") for a in COMMANDS["eval suite"]),
            (r"t\.csv line 2",),
            files=(("t.csv", TABLE_HEADER + "float,floatlm,nano,1000"),),
            protect=("t.csv",),
            note="nothing already written is lost: the table stays byte-identical",
        ),
        Case(
            "scaling fit | a CSV field past csv's size limit",
            ("scaling", "fit", "{W}/t.csv", "--out", "{W}/fit"),
            (r"t\.csv line 2",),
            files=(("t.csv", TABLE_HEADER + "1" * 200_000 + ",r" * 11 + "\n"),),
            protect=("t.csv",),
            absent=("fit",),
        ),
        Case(
            "train | a run config nested past the recursion limit",
            ("train", "--config", "{W}/run.yaml", "--dry-run"),
            (r"run\.yaml.*nested too deeply",),
            files=(("run.yaml", "[" * 600),),
            absent=OUTPUTS,
        ),
        Case(
            "suite plan | a suite file that is a list",
            ("suite", "plan", "{W}/s.yaml"),
            (r"s\.yaml.*mapping",),
            files=(("s.yaml", "- name\n- toy\n"),),
        ),
        Case(
            "data stats | an index.json that is a list",
            ("data", "stats", "{W}/split"),
            (r"index\.json",),
            copies=(("split", "split"),),
            files=(("split/index.json", "[1]"),),
        ),
        Case(
            "export hf | a manifest listing a file outside the snapshot",
            ("export", "hf", "{W}/snap", "{W}/out"),
            (r"COMPLETE.*not a path inside",),
            copies=((SNAP.removeprefix("{F}/"), "snap"),),
            files=(("snap/COMPLETE", '{"step": 10, "files": {"../../x": {"bytes": 1, "crc32": 0}}}'),),
            absent=("out",),
        ),
    ]


CASES: list[Case] = [
    *_defect_cases(),
    *_model_cases(),
    *_kind_cases(),
    *_number_cases(),
    *_output_cases(),
    *_file_cases(),
]
