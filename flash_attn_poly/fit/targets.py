"""Target functions, their derivatives, and the parity transform each program form uses.

A target knows its half-domain residual g(t), t >= 0, which the solver fits, and how the
runtime rebuilds f(x) from it (form + offset).  All in float64.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import erf, expit

SQRT2 = np.sqrt(2.0)
INV_SQRT2PI = 1.0 / np.sqrt(2.0 * np.pi)


def sigmoid(x):
    return expit(x)


def dsigmoid(x):
    s = expit(x)
    return s * (1.0 - s)


def dtanh(x):
    return 1.0 - np.tanh(x) ** 2


def silu(x):
    return x * expit(x)


def dsilu(x):
    s = expit(x)
    return s + x * s * (1.0 - s)


def Phi(x):
    return 0.5 * (1.0 + erf(x / SQRT2))


def gelu(x):
    return x * Phi(x)


def dgelu(x):
    return Phi(x) + x * INV_SQRT2PI * np.exp(-0.5 * x * x)


@dataclass(frozen=True)
class Target:
    name: str            # program-table target name
    derivative: bool
    f: Callable          # the function the program approximates, full domain
    form: str            # runtime reconstruction
    offset: float        # exact constant added after sign restore
    g: Callable          # half-domain residual the solver fits, t >= 0
    monotone: int        # +1 / -1: sign of f' on x >= 0 (shape gate); 0: no gate
    bounds: tuple        # (lo, hi) the output may never leave; None: unbounded

    @property
    def key(self) -> str:
        return self.name + ("_grad" if self.derivative else "")


# Residuals (why): odd forms fit g = f - offset, which vanishes at 0 (so c0 = 0);
# SiLU/GELU subtract the exact x/2 so the remainder t*(sigma(t)-1/2) is even;
# their derivatives subtract 1/2 leaving an odd residual.
TARGETS = {
    "sigmoid": Target("sigmoid", False, sigmoid, "odd", 0.5, lambda t: expit(t) - 0.5, 1, (0.0, 1.0)),
    "sigmoid_grad": Target("sigmoid", True, dsigmoid, "even", 0.0, dsigmoid, -1, (0.0, 0.25)),
    "tanh": Target("tanh", False, np.tanh, "odd", 0.0, np.tanh, 1, (-1.0, 1.0)),
    "tanh_grad": Target("tanh", True, dtanh, "even", 0.0, dtanh, -1, (0.0, 1.0)),
    "silu": Target("silu", False, silu, "residual_even", 0.0, lambda t: t * (expit(t) - 0.5), 1, None),
    "silu_grad": Target("silu", True, dsilu, "residual_odd", 0.5, lambda t: dsilu(t) - 0.5, 0, (-0.2, 1.2)),
    "gelu": Target("gelu", False, gelu, "residual_even", 0.0, lambda t: t * (Phi(t) - 0.5), 1, None),
    "gelu_grad": Target("gelu", True, dgelu, "residual_odd", 0.5, lambda t: dgelu(t) - 0.5, 0, (-0.2, 1.2)),
}


def sigmoid_attn(n: int):
    """sigma(x - ln n) and its derivative, for sigmoid attention over n keys."""
    ln = np.log(n)
    return (lambda x: expit(x - ln)), (lambda x: dsigmoid(x - ln))
