"""A launch-plan model: occupancy, waves and bytes in flight of a GEMV launch, from its compiled resources.

The H200 profile of the ternary GEMV (8192 × 8192, batch 1) found it neither issue- nor bandwidth-bound but
*latency*-bound: 0.5 waves, one active warp per scheduler, and no load in flight while a tile was decoded.
This module turns a launch (grid, warps, pipeline stages, tile bytes) plus what ptxas reports for the kernel
(registers per thread, shared memory per program) into the figures that decide it, so a plan can be judged
on a machine without a GPU:

* **resident programs per SM** — the least of the register file (65,536 32-bit registers, allocated per warp
  in units of 256), the warp slots (64), the program slots (32) and shared memory (228 KB per SM, 1 KB of
  it reserved per program);
* **programs per SM** actually running — the grid spread over the SMs, at most the resident limit;
* **waves** — the grid over (SMs × resident programs);
* **warps per scheduler** — four schedulers per SM: below two, a stalled warp leaves its scheduler idle;
* **bytes in flight per SM** — each running program keeps ``num_stages − 1`` tiles of words loading while
  it decodes one (Triton's pipeliner issues the loads of later iterations as asynchronous copies into shared
  memory), at least one tile at its start; one-stage programs count only when several share an SM, whose
  loads then overlap one another's decode.

**Little's law** gives the bytes that must be in flight to sustain a bandwidth: bandwidth × latency. At the
H200's measured copy rate (4.25 TB/s) and an assumed loaded DRAM latency of 0.7 µs, about 3 MB across the
chip, 22.5 KB per SM. 0.7 µs is the round-trip an HBM3 access takes under load on Hopper — several times
the ~0.5 µs of an idle pointer chase, since queues fill as the bus nears its peak; a lower latency would
lower the requirement, so 0.7 µs errs toward more bytes in flight. Four warps per scheduler is the GEMV's
target for the decode's integer and FMA chains (4–6 cycle latencies, one issue per cycle per scheduler),
two the tensor-core GEMM's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    """What a GPU offers per SM, and the bandwidth and latency the Little's-law minimum assumes."""

    name: str
    sms: int
    bandwidth_gbps: float
    latency_us: float
    registers_per_sm: int = 65536
    register_unit: int = 256
    warps_per_sm: int = 64
    programs_per_sm: int = 32
    shared_per_sm: int = 233472
    shared_reserved_per_program: int = 1024
    schedulers: int = 4
    clock_ghz: float = 1.98

    def issue_floor_us(self, weights: int, instructions_per_weight: float) -> float:
        """The shortest time a kernel can take when every warp scheduler issues one warp instruction per
        cycle: ``instructions_per_weight`` per thread and weight, 32 threads per warp instruction."""
        warp_instructions = weights * instructions_per_weight / 32
        return warp_instructions / (self.sms * self.schedulers * self.clock_ghz * 1e3)

    @property
    def little_bytes_per_sm(self) -> float:
        """Bytes each SM must keep in flight to sustain ``bandwidth_gbps`` at ``latency_us``."""
        return self.bandwidth_gbps * 1e9 * self.latency_us * 1e-6 / self.sms


H200 = DeviceLimits("NVIDIA H200", sms=132, bandwidth_gbps=4250.0, latency_us=0.7)
"""sm_90, 132 SMs at up to 1.98 GHz; 4,250 GB/s is the device-to-device copy rate measured on the H200 on
2026-12-04."""

MIN_WARPS_PER_SCHEDULER = {"gemv": 4, "gemm": 2}
"""Per path: the GEMV's warps issue dependent integer and FMA chains; the GEMM's each carry tensor-core
work of a whole tile between loads, so fewer hide the same latency."""
MIN_PROGRAMS_PER_SM = 2


@dataclasses.dataclass(frozen=True)
class Resources:
    """What ptxas reports for one compiled kernel variant."""

    registers: int
    shared_bytes: int
    num_warps: int


def resident_programs(res: Resources, dev: DeviceLimits = H200) -> int:
    """Programs of this kernel one SM can hold at once (0 when one does not fit)."""
    per_warp = -(-res.registers * 32 // dev.register_unit) * dev.register_unit
    by_regs = dev.registers_per_sm // (per_warp * res.num_warps) if res.registers else dev.programs_per_sm
    by_warps = dev.warps_per_sm // res.num_warps
    need_smem = res.shared_bytes + dev.shared_reserved_per_program
    by_smem = dev.shared_per_sm // need_smem
    return max(0, min(by_regs, by_warps, dev.programs_per_sm, by_smem))


@dataclasses.dataclass(frozen=True)
class LaunchFigures:
    """The model's figures for one launch; :meth:`shortfalls` says which minimum a launch misses."""

    grid: int
    resident: int
    programs_per_sm: float
    waves: float
    warps_per_scheduler: float
    tile_bytes: int
    stages: int
    bytes_in_flight_per_sm: float
    little_bytes_per_sm: float
    path: str = "gemv"

    def shortfalls(self) -> list[str]:
        out = []
        if self.stages < 2:
            out.append("no load overlaps the decode (num_stages 1)")
        if self.programs_per_sm < MIN_PROGRAMS_PER_SM:
            out.append(f"{self.programs_per_sm:.2f} programs per SM < {MIN_PROGRAMS_PER_SM}")
        min_warps = MIN_WARPS_PER_SCHEDULER[self.path]
        if self.warps_per_scheduler < min_warps:
            out.append(f"{self.warps_per_scheduler:.2f} warps per scheduler < {min_warps}")
        if self.bytes_in_flight_per_sm < self.little_bytes_per_sm:
            out.append(
                f"{self.bytes_in_flight_per_sm / 1024:.1f} KB in flight per SM < "
                f"{self.little_bytes_per_sm / 1024:.1f} KB (Little's law)"
            )
        return out

    def row(self) -> dict[str, Any]:
        return {
            "grid": self.grid,
            "resident_per_sm": self.resident,
            "programs_per_sm": round(self.programs_per_sm, 2),
            "waves": round(self.waves, 2),
            "warps_per_scheduler": round(self.warps_per_scheduler, 2),
            "tile_kb": round(self.tile_bytes / 1024, 1),
            "stages": self.stages,
            "kb_in_flight_per_sm": round(self.bytes_in_flight_per_sm / 1024, 1),
            "shortfalls": self.shortfalls(),
        }


def launch_figures(
    grid: int, res: Resources, tile_bytes: int, stages: int, dev: DeviceLimits = H200, path: str = "gemv"
) -> LaunchFigures:
    """The figures of a launch of ``grid`` programs, each loading ``tile_bytes`` per loop iteration."""
    resident = resident_programs(res, dev)
    running = min(float(resident), grid / dev.sms)
    waves = grid / (dev.sms * resident) if resident else math.inf
    warps = running * res.num_warps / dev.schedulers
    in_flight = running * tile_bytes * max(1, stages - 1) * (stages > 1 or running >= 2)
    return LaunchFigures(
        grid, resident, running, waves, warps, tile_bytes, stages, in_flight, dev.little_bytes_per_sm, path
    )
