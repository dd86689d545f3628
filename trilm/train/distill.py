"""Distillation from a float teacher: the teacher model, its checks, and the loss it adds.

A float model turned into a ternary one by continued training (``init_from`` across families) loses most
of what it knew in the first steps, when its weights snap to {−1, 0, +1}; the float model's own output
distribution is a denser target than the next token alone (BitDistill, onebitllms and ParetoQ all train
against it). The teacher is frozen and run on the micro-batch the student sees, so a step's loss stays a
pure function of the step and an interrupted run resumes exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trilm.config import ConfigError
from trilm.model.config import ModelConfig
from trilm.model.transformer import Decoder
from trilm.parallel import ParallelInfo
from trilm.store.open import ModelDir
from trilm.train.config import DistillConfig


def check_teacher(teacher_cfg: ModelConfig, student: ModelConfig, path: str) -> None:
    """Refuse a teacher whose logits do not index the student's vocabulary (other tokenizer or size)."""
    if teacher_cfg.vocab_size != student.vocab_size or teacher_cfg.padded_vocab != student.padded_vocab:
        raise ConfigError(
            f"distill.teacher: {path} has a vocabulary of {teacher_cfg.vocab_size} tokens (embedding "
            f"{teacher_cfg.padded_vocab}), the student {student.vocab_size} ({student.padded_vocab}): a "
            "teacher must share the student's tokenizer"
        )


def check_teacher_tokenizer(path: str, recorded: str | None, data_hash: str | None, data_dir: str) -> None:
    """Refuse a teacher trained on another tokenizer than the run's data (same size, other tokens)."""
    if recorded and data_hash and recorded != data_hash:
        raise ConfigError(
            f"distill.teacher: {path} was trained with another tokenizer than the data in {data_dir} "
            f"(tokenizer hash {recorded[:12]} vs {data_hash[:12]})"
        )


class Teacher:
    """A frozen model on the student's tensor-parallel layout that returns full-vocabulary logits."""

    def __init__(self, model: torch.nn.Module, vocab: int, temperature: float, weight: float):
        self.model = model.eval().requires_grad_(False)
        self.vocab = vocab
        self.temperature = temperature
        self.weight = weight

    @classmethod
    def load(
        cls, opened: ModelDir, cfg: DistillConfig, student: ModelConfig, info: ParallelInfo, bf16: bool
    ) -> Teacher:
        """The teacher ``opened`` (``cfg.teacher``) on the student's layout and device (bf16 when the
        student trains in it)."""
        if opened.stored_packed:
            raise ConfigError(
                f"distill.teacher: {cfg.teacher} is a packed model ({opened.kind}); give its float source"
            )
        check_teacher(opened.config, student, cfg.teacher)
        model_cfg = opened.config.resolved(info.tp_size)
        model_cfg.check_tensor_parallel(info.tp_size)
        model = Decoder(model_cfg, info, seed=0)
        model.load_full_state_dict(opened.weights.float_state())
        model = model.to(device=info.device, dtype=torch.bfloat16 if bf16 else torch.float32)
        return cls(model, student.vocab_size, cfg.temperature, cfg.weight)

    @torch.no_grad()
    def log_probs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """log softmax(logits / T) over the tokenizer's vocabulary, fp32 [b, s, vocab]."""
        logits = self.model(input_ids)[..., : self.vocab].float()
        return F.log_softmax(logits / self.temperature, dim=-1)

    def loss(
        self, student_logits: torch.Tensor, labels: torch.Tensor, teacher_log_probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(combined loss, CE, KL) as means over the micro-batch's tokens."""
        logits = student_logits.float()
        ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten())
        student_log_probs = F.log_softmax(logits[..., : self.vocab] / self.temperature, dim=-1)
        kl = kl_divergence(teacher_log_probs, student_log_probs)
        total = (1 - self.weight) * ce + self.weight * self.temperature**2 * kl
        return total, ce.detach(), kl.detach()


def kl_divergence(teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) per token, averaged over tokens (the last dimension is the vocabulary)."""
    per_token = (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1)
    return per_token.mean()
