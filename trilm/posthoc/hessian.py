"""The GPTQ-family layer statistics: the input Hessian H, its damping, and the upper Cholesky factor of H⁻¹.

Every method that compensates rounding error with second-order information (GPTQ here; PB-LLM, BiLLM and
STBLLM on top of it) needs the same three steps, so they live here once:

1. :class:`HessianAccumulator` — H = (2 / N) · Σ_b X_bᵀ X_b as a running average in fp32, where N counts
   *sequences* (the batch dimension of each call), exactly as the reference ``add_batch`` does. The outputs
   of every method are invariant to a positive global scale of H; only proxy-loss values depend on it.
2. :func:`prepare_hessian` — dead inputs (diag H = 0) get H_dd = 1 and their weight column is zeroed.
3. :func:`inverse_cholesky_upper` — damping λ = percdamp · mean(diag H) on the diagonal, then the *upper*
   Cholesky factor of H⁻¹ ("Hinv" in the reference). When H is not positive definite after damping, the
   damping is multiplied by 10 and the factorization retried (a warning names the layer and the damping
   used) — never a silent NaN.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from trilm.config import ConfigError


class HessianAccumulator:
    """Running average of 2·XᵀX over the sequences seen so far (the reference's ``add_batch``)."""

    def __init__(self, columns: int, device: torch.device | str = "cpu"):
        self.columns = columns
        self.H = torch.zeros((columns, columns), dtype=torch.float32, device=device)
        self.nsamples = 0

    def add_batch(self, x: torch.Tensor) -> None:
        """Add inputs ``x`` of shape (batch, seq, K); a 2-D (tokens, K) input is one sequence (as the
        reference treats it)."""
        if x.shape[-1] != self.columns:
            raise ValueError(f"expected inputs with last dim {self.columns}, got {tuple(x.shape)}")
        if x.dim() == 2:
            x = x.unsqueeze(0)
        batch = x.shape[0]
        x = x.reshape(-1, self.columns).to(self.H.device, torch.float32)
        self.H *= self.nsamples / (self.nsamples + batch)
        self.nsamples += batch
        x = x * (2.0 / self.nsamples) ** 0.5
        self.H.addmm_(x.t(), x)

    def hook(self):
        """A forward pre-hook for ``nn.Module.register_forward_pre_hook`` that feeds the module's input."""

        def pre_hook(_module, args):
            self.add_batch(args[0].detach())

        return pre_hook


@dataclasses.dataclass
class InverseFactor:
    """Upper Cholesky factor of (damped H)⁻¹ and the damping that made H positive definite."""

    hinv: torch.Tensor
    damp: float
    """The λ added to the diagonal (absolute, not relative)."""
    retries: int
    """How many times the damping was multiplied by 10 before the Cholesky factorization succeeded."""


def prepare_hessian(H: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(H, W, dead) copies with dead inputs handled: H_dd = 1 and W[:, d] = 0 where diag(H) = 0."""
    if H.dim() != 2 or H.shape[0] != H.shape[1] or H.shape[0] != W.shape[1]:
        raise ConfigError(
            f"Hessian of shape {tuple(H.shape)} does not match a weight with {W.shape[1]} input columns"
        )
    if not bool(torch.isfinite(H).all()):
        raise ConfigError("the Hessian contains inf or NaN (were the calibration activations finite?)")
    H = H.clone().float()
    W = W.clone().float()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    return H, W, dead


def inverse_cholesky_upper(
    H: torch.Tensor, percdamp: float, *, max_retries: int = 6, name: str = "layer"
) -> InverseFactor:
    """Upper Cholesky factor of (H + λI)⁻¹ with λ = percdamp · mean(diag H), retrying with 10× damping.

    ``H`` is not modified. Raises a clear error when even the largest damping fails.
    """
    if percdamp < 0:
        raise ConfigError(f"percdamp: must be >= 0, got {percdamp}")
    base = float(torch.mean(torch.diag(H)))
    damp = percdamp * base
    eye = torch.arange(H.shape[0], device=H.device)
    for attempt in range(max_retries + 1):
        Hd = H.clone()
        Hd[eye, eye] += damp
        L, info = torch.linalg.cholesky_ex(Hd)
        if int(info) == 0:
            Hi = torch.cholesky_inverse(L)
            U, info = torch.linalg.cholesky_ex(Hi, upper=True)
            if int(info) == 0 and bool(torch.isfinite(U).all()):
                if attempt:
                    warnings.warn(
                        f"{name}: the Hessian was not positive definite with percdamp={percdamp}; "
                        f"succeeded after {attempt} retries with damping {damp:.3g} "
                        f"({damp / base if base else float('inf'):.3g} × mean diag H)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                return InverseFactor(U, damp, attempt)
        damp = max(damp * 10.0, base * 1e-2 if base > 0 else 1e-6)
    raise ConfigError(
        f"{name}: the Hessian is not positive definite even with damping {damp:.3g} "
        f"(percdamp {percdamp}, {max_retries} retries); use more calibration data or a larger percdamp"
    )


def proxy_loss(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor) -> float:
    """tr((Q − W) H (Q − W)ᵀ) in float64: the layer-output error the GPTQ family minimizes."""
    delta = (Q.double() - W.double()).to(H.device)
    return float(torch.einsum("ij,jk,ik->", delta, H.double(), delta))
