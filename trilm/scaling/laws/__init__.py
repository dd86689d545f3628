"""Every scaling law trilm fits, one class each, in one registry (:data:`LAWS`).

Size laws (:mod:`.size`) are fitted on points of results tables; curve laws (:mod:`.curve`) on loss curves
under any learning-rate schedule. All are fitted by :func:`trilm.scaling.fitter.fit` and give a
:class:`trilm.scaling.fitter.Fit`.
"""

from trilm.scaling.laws.base import LAWS, FitError, Law, SizeLaw, get_law, laws_of_kind, register
from trilm.scaling.laws.curve import CurveLaw, MultiPower, Tissue, TissueLambda, areas
from trilm.scaling.laws.size import Additive, Kaplan, KaplanE, PowerD, PowerN, Precision

__all__ = [
    "LAWS",
    "Additive",
    "CurveLaw",
    "FitError",
    "Kaplan",
    "KaplanE",
    "Law",
    "MultiPower",
    "PowerD",
    "PowerN",
    "Precision",
    "SizeLaw",
    "Tissue",
    "TissueLambda",
    "areas",
    "get_law",
    "laws_of_kind",
    "register",
]
