"""Score functions: what the attention kernels do between S = Q K^T and O += P V (forward) and
between the recomputed S and dS (backward).

A score function is one module of this package with its forward and its backward side side by
side (softmax.py, softcap.py, sigmoid.py, user.py), registered by one line in REGISTRY.  What a
call runs is a `ScoreSpec`: pure data (its hash is its content: kind, evaluator, program spec,
poly split, grad rule, user function), chosen by flash_attn_poly.plan and carried by the kernel
configs (kernels/config.py).  `device(spec)` builds the module's device object when a kernel is
traced; it is the only thing here that imports cutlass.  Each module's `Score` subclasses
common.ScoreBase, which holds the spec's choices, the per-key block rule and the softmax family's
defaults (probs by the online softmax, write_p, dscore2), and overrides what differs.

The device object's contract (kernels/attn_fwd_sm90.py and attn_bwd_sm90.py call it):
  host:     fwd_scalars(scale, softcap, bias) -> 4 FP32 kernel arguments (params)
            bwd_scalars(scale, softcap, bias) -> 3 FP32 kernel arguments (args)
  forward:  has_lse, uses_online_softmax, poly_pair(g);
            transform(acc_S, params, coords) before masking (coords: kernels/scores/common.Coords),
            transform_fixed(acc_S, params, coords) (softcap under the constant row max),
            probs(acc_S, tOrP, state, params, is_first, masked, row_scale, is_bf16),
            write_p(acc_S, tOrP, is_bf16) after the PV wait, lse_scale(params), fixed_lse(params)
  backward: needs_lse, needs_dsum, uses_block(col_group),
            prob2(s0, s1, lse0, lse1, args, block, is_bf16, coords) -> (packed P, f0, f1),
            dscore2(f0, f1, dp0, dp1, dsum0, dsum1) -> (g0, g1)

Poly split (`poly_split = (j, k)`): a poly score sends the score pair of key column group
g = key_index // 8 through its program's block when g % k < j and through MUFU otherwise.  The
rule depends only on the key index, so the backward's recompute (which calls the same rule per
key) gets the forward's P bit for bit.  The forward decides per column group at compile time
from g's place in its key block, which is the global rule only when the rule repeats inside a
block: 8k must divide tile_n (`split_fits_block`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Optional

# kind -> module of this package (one line per score function)
REGISTRY = {
    "softmax": "softmax",
    "softcap": "softcap",
    "sigmoid": "sigmoid",
    "user": "user",
}
EVALUATORS = ("native", "poly")
SOFTCAP_GRAD_RULES = ("value", "block")      # d logit/dx from the block's logit, or its derivative block
SIGMOID_GRAD_RULES = ("product", "surrogate")  # sigma' = p (1 - p), or the B3 coupled block's surrogate


@dataclass(frozen=True, kw_only=True)
class ScoreSpec:
    """Which score function a kernel runs, with every choice explicit (the plan fills it)."""
    kind: str                         # a REGISTRY key
    evaluator: str                    # "native" (MUFU) | "poly" (the program's blocks on poly_split)
    program: Any = None               # asm.programs.ProgramSpec the poly columns run (None: none)
    poly_split: tuple = (0, 1)        # (j, k): key column groups g with g % k < j run the program
    grad_rule: Optional[str] = None   # softcap: "value" | "block"; sigmoid: "product" | "surrogate"
    user: Any = None                  # kind "user": a flash_attn_poly.score_mod.ScoreMod
    aux: tuple = ()                   # kind "user": (dtype name, ndim) of each aux tensor it reads
    seq_bias: bool = False            # sigmoid, packed sequences: the kernels add b = -ln S_k of each
                                      # sequence to the params' bias slots (the host's bias is 0)
    mufu_above: Optional[float] = None  # sigmoid poly forward: the block input x' = x + b + ln n above
                                      # which a thread row's block pairs of that key block take sigma on MUFU
                                      # (None: the program's upper clamp)

    def __post_init__(self):
        if self.kind not in REGISTRY:
            raise ValueError(f"score kind must be one of {sorted(REGISTRY)}, got {self.kind!r}")
        if self.evaluator not in EVALUATORS:
            raise ValueError(f"evaluator must be one of {EVALUATORS}, got {self.evaluator!r}")
        j, k = (int(v) for v in self.poly_split)
        if not (k >= 1 and 0 <= j <= k and 16 % k == 0):
            raise ValueError(f"poly_split (j, k) needs 0 <= j <= k, k in (1, 2, 4, 8, 16); got {self.poly_split}")
        object.__setattr__(self, "poly_split", (j, k))
        if self.evaluator == "poly" and self.program is None and self.kind in ("softcap", "sigmoid"):
            raise ValueError(f"a poly {self.kind} score needs its program")
        if self.program is not None and self.program.is_exp2 and (self.kind != "softcap"
                                                                  or self.evaluator != "native"):
            # the exp2 offload: part of the forward's exp2s by the program (FwdConfig.exp2_fma), every
            # tanh on MUFU
            raise ValueError(f"an exp2_f32 program runs in a native softcap score only (the exp2 offload), "
                             f"got {self.kind}/{self.evaluator}")
        if self.kind == "softcap" and self.grad_rule not in SOFTCAP_GRAD_RULES + (None,):
            raise ValueError(f"softcap grad_rule must be one of {SOFTCAP_GRAD_RULES}, got {self.grad_rule!r}")
        if self.kind == "sigmoid" and self.grad_rule not in SIGMOID_GRAD_RULES + (None,):
            raise ValueError(f"sigmoid grad_rule must be one of {SIGMOID_GRAD_RULES}, got {self.grad_rule!r}")
        if self.seq_bias and self.kind != "sigmoid":
            raise ValueError(f"seq_bias (the per-sequence default bias -ln S_k) is sigmoid's only, got {self.kind!r}")
        if self.mufu_above is not None and (self.kind != "sigmoid" or self.evaluator != "poly"):
            raise ValueError(f"mufu_above (the sigmoid block's MUFU threshold) is sigmoid poly's only, got "
                             f"{self.kind}/{self.evaluator}")
        if (self.kind == "user") != (self.user is not None):
            raise ValueError("a user score function (kind 'user') and only it carries user=")


def split_fits_block(split: tuple, key_block: int) -> bool:
    """Can a forward with key blocks of key_block keys apply the per-key rule of split at
    compile time?  Yes when all or no pairs go through the block, or the rule's period
    (8k keys) divides the block."""
    j, k = split
    return j in (0, k) or key_block % (8 * k) == 0


def poly_pair(split: tuple, col_group: int) -> bool:
    """Does key column group `col_group` (= key index // 8) go through the block?"""
    j, k = split
    return col_group % k < j


def device(spec: ScoreSpec):
    """The device object of spec's score function (imports its module, and cutlass)."""
    mod = importlib.import_module(f"{__name__}.{REGISTRY[spec.kind]}")
    return mod.Score(spec)
