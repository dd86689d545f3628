"""GPU checks (skipped without CUDA): bf16 training through DeepSpeed learns; fp32 logits match the CPU."""

import pytest
import torch

from trilm.model import build_model, preset
from trilm.train.trainer import Trainer

from .conftest import tiny_config

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", ["trilm", "floatlm"])
def test_bf16_training_on_gpu_learns(prepared, tmp_path, family):
    cfg = tiny_config(prepared, tmp_path / family, family, precision="bf16", zero_stage=1)
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
