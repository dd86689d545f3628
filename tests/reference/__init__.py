"""Reference data the tests compare against, kept in the repository so a plain clone runs every CPU test.

``quantizers/``: outputs of the original GPTQ, PB-LLM and BiLLM code on one synthetic 64×256 layer
(``quantizers/README.md``). The Chinchilla points that ``trilm scaling chinchilla`` reproduces are package
data of :mod:`trilm.scaling` (``trilm/scaling/data/``), since the command needs them outside the tests too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

QUANTIZER_FIXTURES = Path(__file__).resolve().parent / "quantizers"
QUANTIZER_NPZ = QUANTIZER_FIXTURES / "ref_fixtures.npz"
QUANTIZER_TABLE = QUANTIZER_FIXTURES / "ref_fixtures.json"
QUANTIZER_NPZ_SHA256 = "37a58c0549bdb4b31aadbb5352b9e353e8406c0bf98d24adc2f6a413b7ba9185"


def check_quantizer_fixtures() -> Path:
    """The fixture arrays' path, after checking they are the recorded file (a changed file fails loudly)."""
    digest = hashlib.sha256(QUANTIZER_NPZ.read_bytes()).hexdigest()
    if digest != QUANTIZER_NPZ_SHA256:
        raise AssertionError(f"{QUANTIZER_NPZ}: SHA-256 {digest}, expected {QUANTIZER_NPZ_SHA256}")
    return QUANTIZER_NPZ
