"""Instruction counts of compiled kernels from their SASS, without a GPU (Triton bundles ptxas and nvdisasm).

The GEMV at batch 1 is meant to be bound by memory, so the question the CPU can answer is how many
instructions a thread issues per weight it decodes. :func:`sass_listing` disassembles a cubin;
:func:`loop_bodies` finds the loops (a backward branch closes each); :func:`per_weight` divides the
instructions a program executes by the weights each of its threads handles. For a kernel whose K loop runs
``iterations`` times that is ``(body · iterations + rest) / weights``; a kernel without a loop (the general
kernel's GEMV unrolls its K_ITERS) runs every instruction once. When K is split ``split_k`` ways, the
reduction after the arrival check (:func:`split_tail`) runs in one program of the ``split_k`` that share an
output tile, so it counts ``1 / split_k`` of its length. Predicated-off and untaken-branch instructions are
otherwise counted as executed, so the figures are an upper bound on issue slots, the same for every kernel.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from collections import Counter

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL_REF = re.compile(r"`\((\.L_\w+)\)")
LABEL = re.compile(r"^\s*(\.L_\w+):", re.MULTILINE)
BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")

CLASSES = {
    "int": ("SHF", "LOP3", "LOP", "IADD3", "IADD", "IMAD", "LEA", "ISETP", "SEL", "PRMT", "IMNMX", "VIADD",
            "VIMNMX", "SGXT", "BMSK", "POPC", "FLO", "I2F", "F2I", "IABS", "UIADD3", "ULOP3", "USHF", "UIMAD",
            "ULEA", "UISETP", "USEL", "UMOV", "UPRMT"),
    "fp": ("FFMA", "FADD", "FMUL", "FSEL", "FSETP", "FMNMX", "HFMA2", "HADD2", "HMUL2", "F2F", "F2FP", "HMMA",
           "HGMMA", "MUFU", "FCHK", "DADD", "DFMA", "DMUL"),
    "mem": ("LDG", "STG", "LDS", "STS", "LDSM", "LDGSTS", "RED", "ATOM", "ATOMG", "ATOMS", "LDC", "ULDC",
            "LD", "ST", "LDL", "STL", "UBLKCP", "UTMALDG", "SYNCS", "LDGDEPBAR", "DEPBAR"),
}  # fmt: skip
"""Opcode (before the first '.') → class; everything else (MOV, BRA, BAR, S2R, NOP, …) is "other"."""


@dataclasses.dataclass(frozen=True)
class Instr:
    addr: int
    opcode: str
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def kind(self) -> str:
        for name, ops in CLASSES.items():
            if self.base in ops:
                return name
        return "other"


def _tool(name: str) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    path = os.path.join(os.path.dirname(get_ptxas(90).path), name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} is not bundled with this Triton (looked for {path})")
    return path


def sass_listing(cubin: bytes) -> list[Instr]:
    """The kernel's SASS instructions (NOPs dropped), disassembled with Triton's bundled nvdisasm."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(cubin)
        text = subprocess.run(
            [_tool("nvdisasm"), "-c", path], capture_output=True, text=True, check=True
        ).stdout
    out = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    for line in text.splitlines():
        label = LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        match = INSTR.search(line)
        if match is None:
            continue
        addr = int(match.group(1), 16)
        labels.update(dict.fromkeys(pending, addr))
        pending = []
        instr = Instr(addr, match.group(3), match.group(4).strip())
        if instr.base != "NOP":
            out.append(instr)
    # branch operands name labels: rewrite them as addresses
    return [
        dataclasses.replace(
            i, operands=LABEL_REF.sub(lambda m: f"0x{labels.get(m.group(1), 0):x}", i.operands)
        )
        for i in out
    ]


def loop_bodies(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(first, last) indices of each loop: a branch at ``last`` that jumps back to ``first``."""
    index = {ins.addr: i for i, ins in enumerate(instrs)}
    loops = []
    for i, ins in enumerate(instrs):
        if ins.base == "BRA":
            target = BRANCH_TARGET.search(ins.operands)
            if target and int(target.group(1), 16) < ins.addr:
                first = index.get(int(target.group(1), 16))
                if first is None:  # the target was a dropped NOP: take the next kept instruction
                    first = next(
                        j for j, other in enumerate(instrs) if other.addr >= int(target.group(1), 16)
                    )
                loops.append((first, i))
    return loops


def split_tail(instrs: list[Instr], after: int) -> int:
    """Index of the first instruction of the split-K reduction: the one after the first ``EXIT`` that
    follows the first atomic past index ``after`` (the programs that did not arrive last leave there).

    Raises ``ValueError`` when the listing has no such exit, rather than counting the reduction as run by
    every program."""
    atomic = next((i for i in range(after + 1, len(instrs)) if instrs[i].base in ("ATOMG", "ATOM")), None)
    if atomic is not None:
        leave = next((i for i in range(atomic + 1, len(instrs)) if instrs[i].base == "EXIT"), None)
        if leave is not None:
            return leave + 1
    raise ValueError("split-K kernel: no atomic arrival followed by an EXIT after the K loop in its SASS")


@dataclasses.dataclass
class Count:
    """Per-weight instruction figures of one kernel variant."""

    total: int
    loop_body: int
    reduction: int
    """Instructions of the split-K reduction (run by one program per output tile); 0 without a split."""
    split_k: int
    weights_per_thread: float
    iterations: int
    per_weight: float
    by_kind: dict[str, float]

    def row(self) -> dict:
        return dataclasses.asdict(self)


def per_weight(
    instrs: list[Instr], weights_per_thread: float, iterations: int = 1, split_k: int = 1
) -> Count:
    """Instructions a thread executes per weight: the largest loop runs ``iterations`` times, the rest once
    (the split-K reduction once per ``split_k`` programs).

    ``weights_per_thread`` is the number of weights each thread handles per loop iteration (per program for a
    kernel without a loop)."""
    loops = loop_bodies(instrs)
    body: list[Instr] = []
    last = -1
    if loops:
        first, last = max(loops, key=lambda fl: fl[1] - fl[0])
        body = instrs[first : last + 1]
    if not body:
        iterations = 1
    reduction = len(instrs) - split_tail(instrs, last) if split_k > 1 else 0
    rest = len(instrs) - len(body) - reduction
    executed = len(body) * iterations + rest + reduction / split_k
    weights = weights_per_thread * iterations
    kinds = Counter(i.kind for i in body) if body else Counter(i.kind for i in instrs)
    scale = (iterations if body else 1) / weights
    by_kind = {k: round(kinds.get(k, 0) * scale, 3) for k in ("int", "fp", "mem", "other")}
    return Count(
        len(instrs),
        len(body),
        reduction,
        split_k,
        weights_per_thread,
        iterations,
        round(executed / weights, 3),
        by_kind,
    )
