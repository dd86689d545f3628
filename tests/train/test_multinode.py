"""Multi-node training through torchrun on two loopback nodes (127.0.0.1, 127.0.0.2), two processes each,
tensor parallel 2 inside a node × data parallel 2 across nodes, gloo:

- the same per-step losses, validation losses and final weights (bitwise) as one node with four processes;
- all of node 1 killed mid-step, and again while a state is being written: node 0 exits non-zero within a
  bound, no half-written state is ever loaded, and relaunching both nodes resumes from the newest complete
  state to the weights of the uninterrupted run, bitwise;
- a ZeRO state written by 4 ranks on 2 nodes read by 2 ranks on 1 node, and back (universal checkpoint);
- collective timeouts: every process group gets ``parallel.collective_timeout``, and a rank whose peer
  hangs gives up after it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from trilm.store.integrity import complete_steps, verify_directory
from trilm.testing.cluster import run_distributed
from trilm.testing.cluster.drills import (
    compare_runs,
    events,
    final_weights,
    kill_node_when,
    last_logged_step,
    logged_losses,
    resumed_from,
    run_to_end,
    state_save_started,
    unfinished_checkpoints,
)
from trilm.testing.cluster.launchers import Torchrun
from trilm.testing.cluster.processes import ProcessSet
from trilm.train.checkpoint import RunDir

from .conftest import LAUNCH_TIMEOUT, MULTINODE_STEPS, multinode_config

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
EXIT_BOUND = 120.0
"""Seconds node 0 may take to exit once node 1 is dead. Gloo sees the peer's connections reset at once
(measured: about a second); the bound only has to be far below the collective timeout (600 s), which
would be the other way to notice."""


def test_two_nodes_match_one_node(one_node_run, two_node_run):
    comparison = compare_runs(one_node_run, two_node_run)
    assert comparison.steps == MULTINODE_STEPS and comparison.identical, comparison
    (one,) = events(one_node_run, "placement")
    (two,) = events(two_node_run, "placement")
    assert one["nodes"] == {"0": [0, 1, 2, 3]}
    assert two["nodes"] == {"0": [0, 1], "1": [2, 3]}  # node rank → global ranks (torchrun's GROUP_RANK)
    assert two["tensor_parallel_spans_nodes"] is False  # TP groups {0,1} and {2,3}: inside a node


def _logged(run, step: int) -> bool:
    return last_logged_step(run) >= step


def _sound(run) -> list[int]:
    states = complete_steps(RunDir(run).state)
    for _, path in states:
        assert verify_directory(path) == [], path
    return [step for step, _ in states]


def test_node_failure_and_relaunch(one_node_run, prepared, tmp_path):
    """Node 1 dies twice: in the middle of a step, then while the state of step 12 is being written."""
    run = tmp_path / "run"
    config = multinode_config(prepared, run)
    launcher = Torchrun(2, 2)
    with ProcessSet(tmp_path / "logs") as processes:
        mid_step = kill_node_when(
            processes,
            launcher,
            config,
            run,
            "first",
            partial(_logged, run, 6),
            "step 6 logged",
            timeout=LAUNCH_TIMEOUT,
        )
        mid_save = kill_node_when(
            processes,
            launcher,
            config,
            run,
            "second",
            partial(state_save_started, run, 12),
            "state 12 begun",
            timeout=LAUNCH_TIMEOUT,
        )
        finish = run_to_end(processes, launcher, config, "third", LAUNCH_TIMEOUT)
    for failure in (mid_step, mid_save):
        assert failure.killed_pids >= 3, failure  # the node's launcher and both its training processes
        assert all(code != 0 for code in failure.survivor_codes), failure
        assert failure.survivor_exit_s < EXIT_BOUND, failure
        assert failure.complete_states, failure
    assert max(mid_step.complete_states) <= mid_step.last_logged_step
    assert finish.codes == [0, 0], finish.tail()
    # Each relaunch resumed from the newest complete state the failure left, never from a partial one.
    assert resumed_from(run) == [max(mid_step.complete_states), max(mid_save.complete_states)]
    if 12 not in mid_save.complete_states:  # the kill landed inside the save of step 12 (begun: the trigger)
        # All that may be left of it is its staging directory: rank 0 (on node 0, alive) discards it as the
        # save fails; had rank 0 died, the next save would clear it. Nothing named step-12 is ever loaded.
        assert all(name.startswith("state/.step-12.tmp-") for name in mid_save.unfinished), mid_save
    assert unfinished_checkpoints(run) == []  # nothing unfinished is left once the run has ended
    assert _sound(run)[-1] == MULTINODE_STEPS
    survivor_log = mid_step.survivors[0].output()  # whichever rank of node 0 failed first says so
    assert re.search(r"trilm: rank [01] \(node 0\) stopped in step \d+: ", survivor_log), survivor_log[-3000:]
    assert "rerun the same launch on every node to resume" in survivor_log
    comparison = compare_runs(one_node_run, run)
    assert comparison.identical, comparison


def test_state_crosses_node_counts(two_node_run, prepared, tmp_path):
    """A ZeRO-1 state written by 4 ranks on 2 nodes (DP 2) is read by 2 ranks on 1 node (DP 1), which
    writes its own states; the run goes back to 2 nodes from one of those. Both moves go through
    DeepSpeed's universal checkpoint (the optimizer partitions depend on the DP size)."""
    run = tmp_path / "run"
    config = multinode_config(prepared, run)
    shutil.copytree(two_node_run, run)  # the two-node run, as if it had died right after step 4
    for sub in ("state", "snapshots"):
        for path in (run / sub).glob("step-*"):
            if int(path.name.split("-")[1]) > 4:
                shutil.rmtree(path)
    (run / "logs").rename(tmp_path / "two-node-logs")
    with ProcessSet(tmp_path / "logs") as processes:
        one_node = kill_node_when(
            processes,
            Torchrun(1, 2),
            config,
            run,
            "one",
            lambda: 8 in _complete(run),
            "state 8 written",
            node=0,
            timeout=LAUNCH_TIMEOUT,
        )
        back = run_to_end(processes, Torchrun(2, 2), config, "back", LAUNCH_TIMEOUT)
    assert back.codes == [0, 0], back.tail()
    resumes = [(e["step"], e["saved_dp_size"], e["dp_size"]) for e in events(run, "resume")]
    moved_back = max(one_node.complete_states)
    assert resumes == [(4, 2, 1), (moved_back, 1, 2)]
    assert all("universal checkpoint" in e["detail"] for e in events(run, "resume"))
    placements = [e["nodes"] for e in events(run, "placement")]
    assert placements == [{"0": [0, 1]}, {"0": [0, 1], "1": [2, 3]}]
    assert not list((run / "state").glob(".universal-*"))
    want, got = logged_losses(two_node_run), logged_losses(run)
    assert sorted(got) == list(range(5, MULTINODE_STEPS + 1))
    for step in got:  # same batches; only the order of the data-parallel gradient sums differs
        assert got[step] == pytest.approx(want[step], rel=2e-5, abs=0), step
    a, b = final_weights(two_node_run), final_weights(run)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=2e-4, msg=key)
    final = json.loads((run / f"state/step-{MULTINODE_STEPS}/trainer_state.json").read_text())
    assert (final["dp_size"], final["tp_size"]) == (2, 2)


def _complete(run) -> list[int]:
    return [step for step, _ in complete_steps(RunDir(run).state)]


# ---- collective timeouts ----------------------------------------------------------------------------------
HUNG_PEER_TIMEOUT = 10.0
"""The collective timeout of the hung-peer test. It also bounds the start-up rendezvous, so the ranks
first meet at a file barrier with everything imported: what is left between them is scheduling noise."""


def _hung_peer(timeout: float, flags: str):
    """Rank 1 stops answering (a hung node) until rank 0's next collective has given up after ``timeout``
    (rank 0 then writes its flag)."""
    import megatron.core.parallel_state  # noqa: F401 - imported before the barrier, not inside the rendezvous
    import torch.distributed as dist

    from trilm.parallel import ParallelConfig, init_parallel, tp_group

    rank = int(os.environ["RANK"])
    Path(flags, f"ready-{rank}").touch()
    deadline = time.monotonic() + 600
    while len(list(Path(flags).glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    info = init_parallel(ParallelConfig(tensor_parallel=2, collective_timeout=timeout))
    timeouts = {
        pg.group_desc: pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
        for pg in dist.distributed_c10d._world.pg_map
    }
    gave_up = Path(flags, "rank0-gave-up")
    if info.rank == 1:
        deadline = time.monotonic() + timeout * 30
        while not gave_up.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return timeouts, None, None
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=tp_group())
        error = None
    except RuntimeError as exc:
        error = str(exc)
    waited = time.monotonic() - started
    gave_up.touch()
    return timeouts, error, waited


def test_collective_timeout_reaches_every_group_and_ends_a_hung_collective(tmp_path):
    timeout = HUNG_PEER_TIMEOUT
    (timeouts, error, waited), (peer_timeouts, _, _) = run_distributed(
        _hung_peer, 2, timeout, str(tmp_path), timeout=600
    )
    assert timeouts["default_pg"] == timeout and "TENSOR_MODEL_PARALLEL_GROUP" in timeouts
    assert set(timeouts.values()) == {timeout} and set(peer_timeouts.values()) == {timeout}, timeouts
    assert error is not None and "Timed out" in error, error
    assert timeout - 0.5 <= waited < timeout * 10  # not before the timeout; within a bound after it


def test_collective_timeout_is_validated():
    from trilm.config import ConfigError
    from trilm.parallel import ParallelConfig

    assert ParallelConfig().collective_timeout == 600.0
    with pytest.raises(ConfigError, match="collective_timeout: must be > 0 seconds"):
        ParallelConfig(collective_timeout=0)


def test_nccl_async_error_handling_is_explicit(monkeypatch):
    from trilm.parallel import NCCL_ASYNC_ERROR_HANDLING, enable_nccl_async_error_handling

    monkeypatch.delenv(NCCL_ASYNC_ERROR_HANDLING, raising=False)
    enable_nccl_async_error_handling()
    assert os.environ[NCCL_ASYNC_ERROR_HANDLING] == "3"
    monkeypatch.setenv(NCCL_ASYNC_ERROR_HANDLING, "0")
    with pytest.warns(RuntimeWarning, match="will hang in its collective until the job's time limit"):
        enable_nccl_async_error_handling()
    assert os.environ[NCCL_ASYNC_ERROR_HANDLING] == "0"  # the user's choice is kept
