"""The ``trilm`` command.

Usage: ``trilm <command> [args]``; ``trilm <command> --help`` for one command.

Each command lives in its own module, imported only when that command runs, so ``trilm scaling`` does not
pay for importing torch and ``trilm --help`` is instant. A command module exposes
``build_parser(parser: argparse.ArgumentParser)`` and ``run(args) -> int | None``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trilm.config import ConfigError

COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("trilm.model.cli", "inspect presets: parameter counts, FLOPs per token"),
    "data": ("trilm.data.cli", "corpus, tokenizer training, tokenize into packed shards"),
    "train": ("trilm.train.cli", "pretrain a TriLM/FloatLM/BiLM (same as python -m trilm.train)"),
    "suite": ("trilm.suite.cli", "suites of runs: plan, launch, status, analyse (families × sizes)"),
    "quickstart": ("trilm.quickstart", "the main job on the embedded corpus, on CPU, in minutes"),
    "eval": ("trilm.eval.cli", "evaluate snapshots: perplexity, lm-eval tasks, results table"),
    "scaling": ("trilm.scaling.cli", "fit scaling laws over a results table, compare families, plot"),
    "export": ("trilm.export.cli", "export snapshots: hf (with tokenizer), packed, gguf; a whole suite"),
    "import": ("trilm.export.cli", "import a model: hf (LlamaForCausalLM directory), gguf (llama GGUF file)"),
    "quantize": ("trilm.posthoc.cli", "post-hoc quantization of a float model (gptq, omniquant, …)"),
    "generate": ("trilm.serve.cli", "generate text from a prompt with the inference engine"),
    "serve": ("trilm.serve.cli", "OpenAI-compatible server (/v1/completions, /v1/chat/completions)"),
    "prune": ("trilm.prune.cli", "structured pruning (policy gradient, baselines) → a smaller snapshot"),
}


def _top_parser() -> argparse.ArgumentParser:
    lines = [f"  {name:<11} {desc}" for name, (_, desc) in COMMANDS.items()]
    return argparse.ArgumentParser(
        prog="trilm",
        description="trilm: ternary, binary and float language models.",
        epilog="commands:\n" + "\n".join(lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="trilm <command> [args]",
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _top_parser().print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        _top_parser().error(f"unknown command {name!r}; choose from {', '.join(COMMANDS)}")
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"trilm {name}", description=COMMANDS[name][1])
    module.build_parser(parser, command=name)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except ConfigError as exc:
        print(f"trilm {name}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if "trilm.parallel" in sys.modules:  # a command that built a model holds a process group
            sys.modules["trilm.parallel"].shutdown_parallel()


if __name__ == "__main__":
    sys.exit(main())
