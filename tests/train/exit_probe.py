"""Collected only when named on the command line (by test_clean_exit.py): tests that create process groups
the way the suite does (in-process, through the DeepSpeed engine; and in spawned gloo ranks), so that the
pytest process running them must still exit by itself."""

import torch

from trilm.model import preset
from trilm.model.transformer import Decoder
from trilm.parallel import init_parallel
from trilm.testing.cluster import run_distributed
from trilm.train.config import TrainConfig
from trilm.train.engine import build_engine


def _one_engine_step() -> float:
    info = init_parallel()
    cfg = TrainConfig.from_dict(
        {"model": preset("trilm-nano", vocab_size=256).to_dict(), "batch_tokens": 256, "tokens": 256}
        | {"seq_len": 32, "micro_batch": 8, "zero_stage": 1, "data": {"train_dir": "unused"}}
    )
    engine = build_engine(Decoder(cfg.model, info, seed=0).to(info.device), cfg, 1, info)
    ids = torch.randint(0, 256, (8, 33), device=info.device)
    loss = engine(ids[:, :-1], labels=ids[:, 1:]).mean()
    engine.backward(loss)
    engine.step()
    return float(loss)


def test_engine_step_in_process():
    assert _one_engine_step() > 0


def test_engine_step_on_two_ranks():
    losses = run_distributed(_one_engine_step, 2)
    assert len(losses) == 2
