"""GPU checks (skipped without CUDA): bf16 training through DeepSpeed learns; fp32 logits match the CPU."""

import pytest
import torch

from trilm.model import build_model, preset
from trilm.train.engine import prepare_model
from trilm.train.trainer import Trainer

from .conftest import tiny_config

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", ["trilm", pytest.param("floatlm", marks=pytest.mark.slow)])
def test_bf16_training_on_gpu_learns(prepared, tmp_path, family):
    """Eager (``compile=false``): the compiled default is the slow test below, kept out of the fast run."""
    cfg = tiny_config(prepared, tmp_path / family, family, precision="bf16", zero_stage=1, compile=False)
    summary = Trainer(cfg).fit()
    assert summary.val_losses[24] < summary.val_losses[0] - 0.5


@pytest.mark.slow
def test_default_config_compiles_on_gpu_and_learns(prepared, tmp_path):
    """``compile: auto`` (the default) compiles every block on CUDA; the compiled run learns as eager does."""
    cfg = tiny_config(prepared, tmp_path, "trilm", precision="bf16", zero_stage=1)
    assert cfg.compile == "auto"
    model = build_model(cfg.model, seed=0).cuda()
    prepare_model(model, cfg)
    assert all(block._compiled_call_impl is not None for block in model.layers)
    summary = Trainer(cfg).fit()
    assert summary.val_losses[24] < summary.val_losses[0] - 0.5


def test_gpu_logits_match_cpu_in_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(preset("trilm-tiny", vocab_size=512), seed=2)
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cpu = model(ids)
        gpu = model.cuda()(ids.cuda()).cpu()
    assert (cpu - gpu).abs().max() <= 1e-4
