"""The robustness catalogue as a before → after table.

::

    PYTHONPATH=. python tests/robustness/table.py build /tmp/rob-fixtures    # with this checkout
    PYTHONPATH=/tmp/other:. python tests/robustness/table.py run /tmp/rob-fixtures --json before.json
    PYTHONPATH=. python tests/robustness/table.py run /tmp/rob-fixtures --json after.json
    python tests/robustness/table.py compare before.json after.json          # markdown, issue defects first

``run`` needs only ``trilm.cli.main`` of whichever trilm comes first on the path, so it measures the
command line of another checkout on fixtures written by this one. ``/tmp/other`` holds only links to the
other checkout's ``trilm`` and ``kernels`` packages, so that ``tests`` still comes from this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.append(str(HERE.parents[2]))  # this checkout's tests package, after whatever trilm comes first


def _run(fixtures: Path, out: Path | None, only: str) -> int:
    import trilm
    from tests.robustness.cases import CASES
    from tests.robustness.runner import file_hashes, run_case

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    baseline = file_hashes(fixtures)
    results = []
    work_root = Path(tempfile.mkdtemp(prefix="rob-work-"))
    for i, case in enumerate(c for c in CASES if only in c.id):
        start = time.perf_counter()
        try:
            outcome = run_case(case, fixtures, work_root / f"case-{i}", baseline)
            names = {str(work_root / f"case-{i}"): "{W}", str(fixtures): "{F}"}
            record = {"ok": outcome.ok, "problems": outcome.problems, "summary": outcome.summary(names)}
        except Exception as exc:
            record = {"ok": False, "problems": [f"setup: {exc}"], "summary": f"setup failed: {exc}"}
        record.update(id=case.id, defect=case.defect, note=case.note, seconds=time.perf_counter() - start)
        results.append(record)
        mark = "ok  " if record["ok"] else "FAIL"
        print(f"{mark} {case.id:<70} {record['summary'][:100]}", flush=True)
        baseline = file_hashes(fixtures)  # a case that damaged the fixtures is reported once, not forever
    payload = {"trilm": str(Path(trilm.__file__).resolve().parents[1]), "cases": results}
    if out is not None:
        out.write_text(json.dumps(payload, indent=1) + "\n")
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed}/{len(results)} cases answered safely")
    return 0


def _compare(before: Path, after: Path, full: bool) -> int:
    a = {r["id"]: r for r in json.loads(before.read_text())["cases"]}
    b = {r["id"]: r for r in json.loads(after.read_text())["cases"]}
    order = list(b)

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    def said(r: dict) -> str:
        why = "" if r["ok"] else f" ({'; '.join(r['problems'][:2])})"
        return f"{_verdict(r)}{why}: {r['summary']}"

    def row(r: dict) -> str:
        old = a.get(r["id"])
        was = said(old) if old else "(not run)"
        now = said(r)
        return f"| {r['defect']} | {cell(r['id'])} | {cell(was)} | {cell(now)} |"

    rows = [r for r in b.values() if full or r["defect"]]
    rows.sort(key=lambda r: (r["defect"] == "", r["defect"], order.index(r["id"])))
    print("| defect | case | before | after |")
    print("|---|---|---|---|")
    for r in rows:
        print(row(r))
    kinds = ("safe", "refused, cause not named", "**unsafe**")
    groups: dict[str, list[str]] = {}
    for r in b.values():
        groups.setdefault(r["id"].split(" | ", 1)[-1], []).append(r["id"])
    print("\n| input | cases | before: safe / refused, cause not named / unsafe | after |")
    print("|---|---|---|---|")
    for name, ids in groups.items():
        if len(ids) < 2:
            continue
        counts = []
        for results in (a, b):
            verdicts = [_verdict(results[i]) for i in ids if i in results]
            counts.append(" / ".join(str(verdicts.count(k)) for k in kinds))
        print(f"| {cell(name)} | {len(ids)} | {counts[0]} | {counts[1]} |")
    for name, results in (("before", a), ("after", b)):
        verdicts = [_verdict(r) for r in results.values()]
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in kinds)
        print(f"\n{name}: {len(results)} cases: {counts}")
    return 0


def _verdict(record: dict) -> str:
    """``safe``; ``refused, cause not named`` (exit 2, nothing changed, but the message misses the cause);
    or ``**unsafe**`` (a traceback, a wrong result, a file changed or left behind)."""
    if record["ok"]:
        return "safe"
    if all(p.startswith("output does not name") for p in record["problems"]):
        return "refused, cause not named"
    return "**unsafe**"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("build")
    p.add_argument("fixtures", type=Path)
    p = sub.add_parser("run")
    p.add_argument("fixtures", type=Path)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--only", default="", help="cases whose id contains this")
    p = sub.add_parser("compare")
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--full", action="store_true", help="every case, not only the issue's defects")
    args = parser.parse_args()
    if args.action == "build":
        from tests.robustness.fixtures import build

        print(build(args.fixtures))
        return 0
    if args.action == "run":
        return _run(args.fixtures.resolve(), args.json, args.only)
    return _compare(args.before, args.after, args.full)


if __name__ == "__main__":
    sys.exit(main())
