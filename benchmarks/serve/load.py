"""Load test of ``trilm serve``: concurrent OpenAI clients ramped past the server's capacity, on loopback.

    python -m benchmarks.serve.load --out benchmarks/results                       # CPU, quickstart shape
    python -m benchmarks.serve.load --device cuda --size 190m --max-batch 32 --max-waiting 32 \\
        --levels 8,32,64,128,256 --out benchmarks/results                          # the same on a GPU

What it does, all by itself, and then stops: writes a model (``--family``/``--size``, the quickstart's
128×4 shape with a 2,048-token tokenizer by default; random weights, drawn peaked as in the serving tests
so that greedy decoding has clear winners) unless ``--model`` names one; starts the real ``trilm serve``
command twice on free loopback ports — one server with admission control (``--max-waiting``,
``--request-timeout``) and one whose queue is in effect unbounded (``--max-waiting 1000000``, no
deadline; ``--no-unbounded`` leaves it out); asks each prompt once with no other request in flight (the
*lone run*: the reference text, and the lone time to first token and latency); then, for each level of
concurrent clients (``--levels``), runs that many closed-loop clients for ``--level-seconds`` per server,
in ``--rounds`` rounds that alternate between the two servers (on a shared CPU the machine's speed swings
within seconds; alternating lets both meet the same machine). Each client sends a streaming greedy
completion, reads it to the end and sends the next; after a refusal (429/503) it waits what the
answer's ``Retry-After`` says, as the ``openai`` client's own retries do (``--retry-wait S``: a fixed
pause instead). Every accepted request must end with ``finish_reason == "length"``, ``max_tokens`` completion
tokens and exactly the lone run's text; any other outcome is counted as wrong. So the JSON shows side by
side what the limits change: refusals instead of a growing queue, and latency that stops growing past
capacity instead of growing with the number of clients.

Bounds: the server binds 127.0.0.1 only; the whole run stops after ``--max-seconds`` (levels not reached
are listed as skipped) or ``--max-requests`` attempts; every request has a client timeout. Output:
``serve-load-<device>-<date>.json`` (``--out``): the machine, the settings, per level throughput
(completed requests/s, generated tokens/s), p50/p99 time to first token and latency of the accepted
requests, the fraction refused, the most requests seen waiting, the server's own counts from
``/metrics``, and the verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import machine, today, write_result
from benchmarks.serve._process import Server

UNBOUNDED_WAITING = 1_000_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="a model directory (default: write one)")
    p.add_argument("--family", default="trilm", choices=("trilm", "floatlm", "bilm"))
    p.add_argument("--size", default="tiny", help="preset size of the written model (tiny: 128x4)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads (CPU)")
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-waiting", type=int, default=4)
    p.add_argument("--request-timeout", type=float, default=60.0, help="the limited server's deadline")
    p.add_argument("--max-tokens", type=int, default=32, help="longest completion (they range to half)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--levels", default="1,2,4,8,16,32", help="concurrent clients, in order")
    p.add_argument("--level-seconds", type=float, default=15.0, help="per level and server")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds a level is split into")
    p.add_argument(
        "--retry-wait", type=float, default=None, help="a refused client's pause (default: Retry-After)"
    )
    p.add_argument("--max-seconds", type=float, default=900.0, help="the whole run, both servers")
    p.add_argument("--max-requests", type=int, default=20_000, help="attempts, the whole run")
    p.add_argument("--no-unbounded", action="store_true", help="skip the server without limits")
    p.add_argument("--conditions", default="", help="what else ran on the machine (into the JSON)")
    p.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    p.add_argument("--markdown", type=Path, default=None, help="print a result file's tables, run nothing")
    args = p.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    if min(args.levels) < 1 or args.max_tokens < 2 or args.max_batch < 1 or args.max_waiting < 0:
        p.error("--levels, --max-tokens (>= 2), --max-batch and --max-waiting must be positive")
    return args


# -- the model ----------------------------------------------------------------------------------------
def peaked_state(cfg, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with fan-in scaling and a 3x head: peaked next-token distributions, so a greedy
    token never hangs on a near-tie that a different batch size's rounding could flip."""
    from trilm.model.spec import canonical_shapes

    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in canonical_shapes(cfg).items():
        if len(shape) == 1:
            state[name] = 1 + 0.1 * torch.randn(shape, generator=gen)
        elif name == "embed.weight":
            state[name] = torch.randn(shape, generator=gen)
        else:
            scale = (3.0 if name == "head.weight" else 1.0) / shape[1] ** 0.5
            state[name] = scale * torch.randn(shape, generator=gen)
    return state


def write_model(workdir: Path, family: str, size: str, vocab: int = 2048) -> Path:
    from trilm.data import embedded_corpus_dir
    from trilm.data.slimpajama import read_documents
    from trilm.data.tokenizer import train_tokenizer
    from trilm.model import preset
    from trilm.model.snapshot import SnapshotMeta
    from trilm.store import snapshot as store

    files = sorted(embedded_corpus_dir().glob("train/chunk*/*.jsonl.zst"))
    docs = list(itertools.islice((d.text for f in files for d in read_documents(f)), 400))
    tok = train_tokenizer(docs, workdir / "tokenizer.model", vocab_size=vocab, num_threads=1)
    cfg = preset(f"{family}-{size}", vocab_size=vocab)
    meta = SnapshotMeta(family=family, size=size, tokenizer_hash=tok.hash)
    out = workdir / f"{family}-{size}"
    store.write_snapshot(out, cfg, meta, peaked_state(cfg), tokenizer=tok.path)
    return out


def prompts_and_lengths(n: int, max_tokens: int) -> list[tuple[str, int]]:
    """``n`` prompts cut from the embedded corpus (3–24 words) with completion lengths spread over
    [max_tokens / 2, max_tokens], so requests finish at different steps and the batch keeps changing."""
    from trilm.data import embedded_corpus_dir
    from trilm.data.slimpajama import read_documents

    files = sorted(embedded_corpus_dir().glob("test/chunk*/*.jsonl.zst"))
    words = [d.text.split() for f in files for d in read_documents(f)]
    words = [w for w in words if len(w) >= 24]
    low = max_tokens // 2
    return [
        (" ".join(words[i % len(words)][: 3 + (7 * i) % 22]), low + (5 * i) % (max_tokens - low + 1))
        for i in range(n)
    ]


# -- the server ---------------------------------------------------------------------------------------
def serve_options(args, max_waiting: int, timeout: float) -> list[str]:
    """The load test's ``trilm serve`` options: one server differs from the other only in its limits."""
    options = ["--device", args.device, "--threads", str(args.threads), "--max-batch", str(args.max_batch)]
    options += ["--max-waiting", str(max_waiting), "--request-timeout", str(timeout)]
    return [*options, "--log-level", "warning", "--model-name", "load"]


def scrape(url: str) -> dict[str, float]:
    """The server's counters and gauges, read with prometheus_client's parser (histograms: count, sum)."""
    import httpx2 as httpx
    from prometheus_client.parser import text_string_to_metric_families

    for attempt in range(3):
        try:
            text = httpx.get(url + "/metrics", timeout=30).text
            break
        except httpx.TransportError:
            if attempt == 2:
                raise
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{label}}}" if label else s.name] = s.value
    return out


# -- the clients --------------------------------------------------------------------------------------
async def one_request(client, prompt: str, max_tokens: int, timeout: float) -> dict:
    import openai

    start = time.perf_counter()
    first, parts, usage, finish = None, [], None, None
    try:
        stream = await client.completions.create(
            model="load", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, timeout=timeout,
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices:
                if first is None:
                    first = time.perf_counter()
                parts.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
    except openai.APIStatusError as exc:
        status = exc.status_code
        outcome = "refused" if status in (429, 503) else "error"
        elapsed = time.perf_counter() - start
        retry_after = float(exc.response.headers.get("retry-after", 1))
        return {"outcome": outcome, "status": status, "message": str(exc)[:200], "latency_s": elapsed,
                "retry_after": retry_after}  # fmt: skip
    except (TimeoutError, openai.APIError) as exc:  # a mid-stream error event, a client timeout
        return {"outcome": "error", "status": None, "message": f"{type(exc).__name__}: {exc}"[:200]}
    end = time.perf_counter()
    return {
        "outcome": "accepted",
        "text": "".join(parts),
        "finish_reason": finish,
        "completion_tokens": usage,
        "ttft_s": None if first is None else first - start,
        "latency_s": end - start,
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


class Budget:
    """The run's bounds: attempts left and the wall-clock deadline."""

    def __init__(self, requests: int, seconds: float):
        self.requests, self.deadline = requests, time.monotonic() + seconds

    def take(self) -> bool:
        if self.requests <= 0 or time.monotonic() >= self.deadline:
            return False
        self.requests -= 1
        return True


SERVER_COUNTS = {
    "finished_length": "trilm_requests_finished_total{reason=length}",
    "finished_cancelled": "trilm_requests_finished_total{reason=cancelled}",
    "finished_timeout": "trilm_requests_finished_total{reason=timeout}",
    "rejected_queue_full": "trilm_requests_rejected_total{reason=queue_full}",
    "generation_tokens": "trilm_generation_tokens_total",
    "queue_seconds_sum": "trilm_request_queue_seconds_sum",
    "queue_seconds_count": "trilm_request_queue_seconds_count",
    "latency_seconds_sum": "trilm_request_latency_seconds_sum",
    "latency_seconds_count": "trilm_request_latency_seconds_count",
}
"""What the server itself counted during a round (from /metrics), to set beside what the clients saw."""


async def run_round(url: str, clients: int, seconds: float, jobs, reference, args, budget: Budget) -> dict:
    import httpx2 as httpx
    import openai

    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    client = openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="load", max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits),
    )  # fmt: skip
    records: list[dict] = []
    timeout = args.request_timeout + 30
    counter = itertools.count()
    seen = {"running": 0, "waiting": 0}

    async def one_client() -> None:
        first = True  # every client sends at least once a round, however slowly the machine runs
        while (first or time.monotonic() < level_end) and budget.take():
            first = False
            k = next(counter) % len(jobs)
            prompt, n = jobs[k]
            rec = await one_request(client, prompt, n, timeout)
            rec["job"] = k
            records.append(rec)
            if rec["outcome"] == "refused":
                wait = rec["retry_after"] if args.retry_wait is None else args.retry_wait
                await asyncio.sleep(wait)

    async def watch() -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            while time.monotonic() < level_end:
                try:
                    health = (await http.get(url + "/health")).json()
                except httpx.TransportError:  # a kept-alive connection the server closed meanwhile
                    seen["health_retries"] = seen.get("health_retries", 0) + 1
                    continue
                seen["running"] = max(seen["running"], health["running"])
                seen["waiting"] = max(seen["waiting"], health["waiting"])
                await asyncio.sleep(0.05)

    before = scrape(url)
    level_end = min(time.monotonic() + seconds, budget.deadline)
    started = time.perf_counter()
    await asyncio.gather(watch(), *(one_client() for _ in range(clients)))
    wall = time.perf_counter() - started
    after = scrape(url)
    await client.close()
    for rec in records:
        if rec["outcome"] == "accepted":
            n = jobs[rec["job"]][1]
            rec["correct"] = (
                rec["text"] == reference[rec["job"]]
                and rec["finish_reason"] == "length"
                and rec["completion_tokens"] == n
            )
    server = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in SERVER_COUNTS.items()}
    return {"records": records, "wall": wall, "seen": seen, "server": server}


def summarize(clients: int, rounds: list[dict]) -> dict:
    """One level of one server: its rounds pooled."""
    records = [r for rnd in rounds for r in rnd["records"]]
    wall = sum(rnd["wall"] for rnd in rounds)
    accepted = [r for r in records if r["outcome"] == "accepted"]
    refused = [r for r in records if r["outcome"] == "refused"]
    errors = [r for r in records if r["outcome"] == "error"]
    ttft = [r["ttft_s"] for r in accepted if r["ttft_s"] is not None]
    latency = [r["latency_s"] for r in accepted]
    refusal = [r["latency_s"] for r in refused]
    tokens = sum(r["completion_tokens"] or 0 for r in accepted)
    server = {k: sum(rnd["server"][k] for rnd in rounds) for k in SERVER_COUNTS}
    queue = server["queue_seconds_sum"] / max(server["queue_seconds_count"], 1)
    service = server["latency_seconds_sum"] / max(server["latency_seconds_count"], 1) - queue
    return {
        "clients": clients,
        "rounds": len(rounds),
        "wall_s": round(wall, 3),
        "attempts": len(records),
        "accepted": len(accepted),
        "refused": len(refused),
        "refused_by_status": {str(s): sum(r["status"] == s for r in refused) for s in (429, 503)},
        "errors": len(errors),
        "error_samples": [r["message"] for r in errors[:3]],
        "wrong": sum(not r["correct"] for r in accepted),
        "refused_fraction": round(len(refused) / len(records), 4) if records else None,
        "completed_per_s": round(len(accepted) / wall, 3),
        "generated_tokens_per_s": round(tokens / wall, 1),
        "ttft_s": {"p50": _round(_percentile(ttft, 0.5)), "p99": _round(_percentile(ttft, 0.99))},
        "latency_s": {
            "p50": _round(_percentile(latency, 0.5)),
            "p99": _round(_percentile(latency, 0.99)),
            "max": _round(max(latency, default=None)),
        },
        "refusal_latency_s": {
            "p50": _round(_percentile(refusal, 0.5)),
            "p99": _round(_percentile(refusal, 0.99)),
        },
        "retry_after_s": sorted({r["retry_after"] for r in refused}),
        "most_running_seen": max(rnd["seen"]["running"] for rnd in rounds),
        "most_waiting_seen": max(rnd["seen"]["waiting"] for rnd in rounds),
        "server": server,
        "server_mean_queue_s": _round(queue),
        "server_mean_service_s": _round(service),
        "queue_over_service": _round(queue / service) if service > 0 else None,
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


async def lone_runs(url: str, jobs, timeout: float) -> tuple[list[str], dict]:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="load", max_retries=0)
    recs = [await one_request(client, prompt, n, timeout) for prompt, n in jobs]
    await client.close()
    bad = [r for r in recs if r["outcome"] != "accepted" or r["finish_reason"] != "length"]
    if bad:
        raise RuntimeError(f"a lone request failed: {bad[0]}")
    ttft = [r["ttft_s"] for r in recs]
    lat = [r["latency_s"] for r in recs]
    stats = {
        "ttft_s": {"p50": _round(_percentile(ttft, 0.5)), "max": _round(max(ttft))},
        "latency_s": {"p50": _round(_percentile(lat, 0.5)), "max": _round(max(lat))},
    }
    return [r["text"] for r in recs], stats


# -- the run ------------------------------------------------------------------------------------------
def ramp(args, model: Path, workdir: Path, budget: Budget) -> list[dict]:
    """Both servers up at once; each level runs against one, then the other, so that the two see the
    machine in the same state (an idle server only waits on its event loop)."""
    configs = [("limited", args.max_waiting, args.request_timeout)]
    if not args.no_unbounded:
        configs.append(("unbounded", UNBOUNDED_WAITING, 0))
    servers = [
        (name, Server(model, serve_options(args, w, t), workdir / f"server-{name}.log"))
        for name, w, t in configs
    ]
    runs = [
        {"server": name, "command": " ".join(server.command[1:]), "levels": [], "skipped_levels": []}
        for name, server in servers
    ]
    try:
        reference = None
        for (_, server), run in zip(servers, runs):
            server.wait_ready()
            texts, run["lone"] = asyncio.run(lone_runs(server.url, args.jobs, args.request_timeout + 30))
            reference = reference or texts
            run["lone_equals_reference"] = texts == reference
        seconds = args.level_seconds / args.rounds
        for clients in args.levels:
            if budget.requests <= 0 or time.monotonic() >= budget.deadline:
                for run in runs:
                    run["skipped_levels"].append(clients)
                continue
            rounds = [[] for _ in servers]
            for _ in range(args.rounds):  # alternating, so a swing in the machine's load hits both
                for (_, server), got in zip(servers, rounds):
                    got.append(asyncio.run(run_round(server.url, clients, seconds, args.jobs, reference,
                                                     args, budget)))  # fmt: skip
            for (name, _), run, got in zip(servers, runs, rounds):
                level = summarize(clients, got)
                run["levels"].append(level)
                lat = level["latency_s"]
                print(
                    f"{name:9s} {clients:4d} clients: {level['accepted']:5d} accepted {level['refused']:5d} "
                    f"refused ({level['refused_fraction']}) {level['wrong']} wrong {level['errors']} errors; "
                    f"{level['generated_tokens_per_s']:8.1f} tok/s; latency p50 {lat['p50']} p99 "
                    f"{lat['p99']} s; waiting <= {level['most_waiting_seen']}",
                    flush=True,
                )
    finally:
        for (_, server), run in zip(servers, runs):
            run["exit_code"] = server.stop()
    return runs


def verdicts(args, runs: list[dict]) -> dict:
    """What the issue asks the run to show, computed from the levels: refusals instead of a growing queue
    past capacity, latency that stops growing there, and no accepted request with a wrong answer.

    ``queue_over_service`` (the server's mean time waiting for a slot over its mean time from prefill to
    last token, from its own histograms) measures queueing in units of the machine's current speed: on a
    shared CPU whose speed swings it is the steadier sign of whether waiting grows with the clients."""
    capacity = args.max_batch + args.max_waiting
    limited = runs[0]
    past = [lv for lv in limited["levels"] if lv["clients"] > capacity]
    out = {
        "capacity_requests": capacity,
        "levels_past_capacity": [lv["clients"] for lv in past],
        "wrong_accepted_requests": sum(lv["wrong"] for run in runs for lv in run["levels"]),
        "errors": sum(lv["errors"] for run in runs for lv in run["levels"]),
        "refused_past_capacity": all(lv["refused"] > 0 for lv in past) if past else None,
        "waiting_never_above_limit": all(
            lv["most_waiting_seen"] <= args.max_waiting for lv in limited["levels"]
        ),
        "clean_exits": all(run["exit_code"] == 0 for run in runs),
    }
    for run in runs:
        levels = [lv for lv in run["levels"] if lv["latency_s"]["p50"] is not None]
        at = [lv for lv in levels if lv["clients"] <= capacity]
        if not levels or not at:
            continue
        top, cap = levels[-1], at[-1]
        out[run["server"]] = {
            "latency_p50_s_by_clients": {lv["clients"]: lv["latency_s"]["p50"] for lv in levels},
            "latency_p99_s_by_clients": {lv["clients"]: lv["latency_s"]["p99"] for lv in levels},
            "most_waiting_seen_by_clients": {lv["clients"]: lv["most_waiting_seen"] for lv in levels},
            "queue_over_service_by_clients": {lv["clients"]: lv["queue_over_service"] for lv in levels},
            f"latency_growth_{cap['clients']}_to_{top['clients']}_clients": {
                q: round(top["latency_s"][q] / cap["latency_s"][q], 3) for q in ("p50", "p99")
            },
        }
    return out


def markdown(result: dict) -> str:
    """The tables of a result file, one row per level of clients, a table per server."""
    s = result["settings"]
    lines = [
        f"{s['model']}, {s['max_batch']} slots, max_waiting {s['max_waiting']} (capacity "
        f"{s['max_batch'] + s['max_waiting']} requests), {s['completion_tokens'][0]}–"
        f"{s['completion_tokens'][-1]} tokens per completion, {s['level_seconds']:g} s per level and server",
    ]
    for run in result["runs"]:
        lone = run["lone"]
        lines += [
            "",
            f"**{run['server']}** (lone run: time to first token {lone['ttft_s']['p50']:.3f} s, latency "
            f"{lone['latency_s']['p50']:.2f} s, medians)",
            "",
            "| clients | completed/s | tokens/s | refused | TTFT p50 / p99 (s) | latency p50 / p99 (s) "
            "| server: queue + service, mean (s) | most waiting | wrong |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for lv in run["levels"]:
            t, lat = lv["ttft_s"], lv["latency_s"]
            lines.append(
                f"| {lv['clients']} | {lv['completed_per_s']:.2f} | {lv['generated_tokens_per_s']:.0f} | "
                f"{100 * lv['refused_fraction']:.0f} % ({lv['refused']}) | {t['p50']:.2f} / {t['p99']:.2f} | "
                f"{lat['p50']:.2f} / {lat['p99']:.2f} | {lv['server_mean_queue_s']:.2f} + "
                f"{lv['server_mean_service_s']:.2f} | "
                f"{lv['most_waiting_seen']} | {lv['wrong']} of "
                f"{lv['accepted']} |"
            )
    return "\n".join(lines)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the servers' stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    signal.signal(signal.SIGTERM, _interrupted)
    started = time.time()
    load_before = [round(x, 2) for x in os.getloadavg()]
    budget = Budget(args.max_requests, args.max_seconds)
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        workdir = Path(tmp)
        model = args.model or write_model(workdir, args.family, args.size)
        args.jobs = prompts_and_lengths(args.prompts, args.max_tokens)
        runs = ramp(args, model, workdir, budget)
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    result = {
        "benchmark": "serve_load",
        "device": machine(
            kind=kind,
            server_device=args.device,
            load_average_before=load_before,
            conditions=args.conditions,
        ),
        "wall_seconds": round(time.time() - started, 1),
        "settings": {
            "model": str(args.model) if args.model else f"{args.family}-{args.size} (peaked random weights)",
            "server_threads": args.threads,
            "max_batch": args.max_batch,
            "max_waiting": args.max_waiting,
            "request_timeout_s": args.request_timeout,
            "levels": args.levels,
            "level_seconds": args.level_seconds,
            "retry_wait_s": "Retry-After" if args.retry_wait is None else args.retry_wait,
            "prompts": len(args.jobs),
            "completion_tokens": sorted({n for _, n in args.jobs}),
        },
        "runs": runs,
        "verdicts": verdicts(args, runs),
    }
    print(json.dumps(result["verdicts"], indent=1))
    if args.out is not None:
        path = args.out / f"serve-load-{kind}-{today()}.json"
        write_result(path, result, module=__spec__.name, argv=argv)
        print(f"wrote {path}")
    return 0 if result["verdicts"]["wrong_accepted_requests"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
