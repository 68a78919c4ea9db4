"""The plan: every default of an attention call, in one place.

`resolve(call, sm_count)` turns a validated call (`AttnCall`: what the user asked for and the
shapes) into a frozen `AttnPlan`: the score function with its program and poly split, the forward
kernel config, the backward kernel config and the runtime scalars.  The forward and the
backward of a call consume the same plan; nothing below this module computes a default (kernel
and score constructors take every field explicitly).

Each default is one row of a table below: the call facts it matches, the fields it sets, a
one-line reason and the docs/MEASURED.md entry that holds the measurement.  Rows apply in
order; a later matching row overrides an earlier one.  `overrides` (timing tools, tests) replace
fields after the rows and are checked like everything else.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

# -------------------------------------------------------------------------------- the call


@dataclass(frozen=True)
class AttnCall:
    """A validated attention call: options, dtype and shapes (interface.validate builds it)."""
    mode: str                          # "softmax" | "softcap" | "sigmoid"
    evaluator: str                     # "poly" | "native"
    dtype: str                         # "bf16" | "fp16"
    head_dim: int
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    causal: bool
    window: tuple                      # (left, right), -1 = unbounded
    softmax_scale: float
    softcap: Optional[float] = None
    sigmoid_bias: Optional[float] = None
    program: Any = None                # None | table name | asm.programs.ProgramSpec
    deterministic: bool = False
    sigmoid_grad: Optional[str] = None  # None | "product" | "surrogate"
    score_mod: Any = None              # a user ScoreMod (mode "softmax"), see flash_attn_poly.score_mod
    aux: tuple = ()                    # (dtype name, ndim) of each aux tensor the score_mod reads
    varlen: bool = False               # packed sequences (flash_attn_poly.varlen): batch = sequences,
                                       # seqlen_q / seqlen_k = the longest ones
    varlen_ragged: bool = False        # packed sequences whose query lengths differ (total_q < batch x seqlen_q)


@dataclass(frozen=True)
class Row:
    when: Mapping[str, Any]            # call facts (see _facts) that must all match
    sets: Mapping[str, Any]            # fields this row sets
    why: str                           # one line
    measured: str = ""                 # docs/MEASURED.md section (or "" for a structural rule)

    def matches(self, facts: Mapping[str, Any]) -> bool:
        return all(facts.get(k) == v for k, v in self.when.items())


# ------------------------------------------------------------------------- the default rows
# softcap's constant row max needs the capped logits bounded: BF16 P and caps up to this keep
# the smallest p = e^(20 - 2c) normal (kernels/scores/softcap.py, fixed_lse)
FIXED_MAX_CAP = 50.0
EXP2_PROGRAM = "exp2_f32_d3"

# softcap on FP16 inputs has no default program: the packed tanh program misses the error rule
# there (poly_outside_rule), so poly runs the native score (by name it runs, with a warning)
PROGRAM_ROWS = (
    Row({"mode": "softcap", "dtype": "bf16"}, {"program": "softcap_c50_f16_odd"},
        "BF16 caps above 50 (no constant max): packed-FP16 odd tanh program, error 1.02x native at "
        "score std ~12, <= 1.84x at std ~20", "softcap-program"),
    Row({"mode": "softcap", "fixed_max_ok": True}, {"program": EXP2_PROGRAM},
        "exp2 offload: every tanh on MUFU, 2^a on the FMA pipe for 1/8 of the columns; native's "
        "error, forward 1.04x native's speed", "softcap-exp2-offload"),
    Row({"mode": "sigmoid"}, {"program": "sigmoid_attn_n4096_f16"},
        "packed-FP16 D4 program: error 1.06-1.12x native (the seed's BF16 D3: 2.7-9.5x)",
        "sigmoid-program"),
)

# A sigmoid_attn program (fitted for sigma(x - ln n)) is fed x + b + ln n, so any bias b runs it,
# but its fit weighted score distributions around b = -ln n.  Outside this span of
# b + ln n the plan takes the native sigmoid instead (poly_outside_rule): at the
# default bias b = -ln S_k the span is S_k in about [n / 33, 4 n].
SIGMOID_FIT_SPAN = (-1.4, 3.5)
# The sigmoid block's P is up to 0.4% off (relative) for block inputs x' = x + b + ln n in [2, 4] and
# ~1% above (the default program), 2-5x a BF16 rounding of P: one large score on one of its columns
# could put O past the FlashAttention rule (a fuzz draw at S_k = 162: 1.08x).  Above this x' a
# thread row's block pairs of that key block take sigma on MUFU (the forward's _above_clamp branch),
# where P >= sigma(4 - ln 4096) = 0.013 (docs/MEASURED.md sigmoid-program-tail).
SIGMOID_MUFU_ABOVE = 4.0

SPLIT_ROWS = (
    Row({"mode": "softcap"}, {"poly_split": (1, 8)},
        "1/8 of the key columns through the block balances MUFU and FMA pipes", "softcap-split"),
    Row({"mode": "sigmoid"}, {"poly_split": (1, 16)},
        "1/16: forward at native's speed, error 1.04-1.06x native", "sigmoid-split"),
)

GRAD_ROWS = (
    Row({"mode": "softcap", "program_dtype": "f16"}, {"softcap_grad": "value"},
        "d logit/dx = 1 - (logit/c)^2 from the block's logit: no second block, no spill",
        "softcap-grad-rule"),
    Row({"mode": "softcap", "program_dtype": "bf16"}, {"softcap_grad": "block"},
        "the seed's B2: the differentiated D3 program (the value rule spills at 1/2)",
        "softcap-grad-rule"),
    Row({"mode": "sigmoid"}, {"sigmoid_grad": "product"},
        "sigma' = p (1 - p) from the recomputed P: same error as native, no second program",
        "sigmoid-grad-rule"),
)

# the dense causal D = 64 forward's tile and its three mechanisms, as packed calls take them
D64_PACKED_FWD = dict(tile_m=192, num_stages=3, pingpong=True, mask_bits=True, o_smem=True)

FWD_ROWS = (
    Row({}, dict(tile_m=128, tile_n=128, num_stages=2, pingpong=False, persistent=True,
                 row_max_chains=1, row_sum_carry=False, rescale_threshold=0.0, fixed_max=False,
                 exp2_fma=0, varlen=False, varlen_compact=False, o_smem=False,
                 mask_bits=False, pack_gqa=False, q_stages=1, o_tma=False, wg_skip=False, q_bottom=False,
                 l2_section_mb=32),
        "two consumer warpgroups of 64 rows, 2 K/V stages, a persistent LPT-ordered grid (0.92-0.96x)",
        "fwd-persistent"),
    Row({}, dict(balance_ctas=True),
        "the persistent grid's CTA count from the snake's balance model: 0.63-0.87x the time of 132 "
        "CTAs at causal D = 256 and causal MHA D = 128 (softmax, sigmoid), 1.00x at the anchor",
        "fwd-persistent-ctas"),
    Row({"head_dim": 256}, dict(tile_n=64),
        "Q 128 x 256 + 2 stages of 64-key K and V fill 192 of sm_90's 227 KB", ""),
    Row({"poly_score": True}, dict(pingpong=True),
        "scores with a packed program (not the exp2 offload, a native-tanh score) overlap better "
        "with warpgroup ping-pong", "fwd-pingpong"),
    Row({"mode": "softmax"}, dict(rescale_threshold=8.0),
        "keep a stale row max until it grows by 2^8: 0.90-0.93x the time, O error 1.03-1.20x",
        "fwd-rescale-threshold"),
    Row({"mode": "softmax", "head_dim": 128}, dict(pingpong=True, row_sum_carry=True, row_max_chains=4),
        "ping-pong, carried row sum and 4 max chains: 0.975x the time at D = 128", "fwd-row-sum-carry"),
    Row({"mode": "softcap", "head_dim": 256}, dict(row_sum_carry=True),
        "carried row sum: 0.94x (native) / 0.976x (poly) at D = 256", "fwd-row-sum-carry"),
    Row({"mode": "softcap", "fixed_max_ok": True}, dict(fixed_max=True),
        "constant row max c - 20 for bounded capped logits: no max reduction, no O rescale; O over "
        "the rounded P's sum, LSE over the FP32 sum",
        "fwd-fixed-max"),
    Row({"mode": "softcap", "fixed_max_ok": True, "head_dim": 128},
        dict(tile_m=192, tile_n=64, num_stages=4, pingpong=False),
        "three consumer warpgroups, tile 192 x 64, 4 stages: 0.95x (poly) / 0.98x (native)",
        "fwd-three-warpgroups"),
    Row({"mode": "softcap", "fixed_max_ok": True, "head_dim": 128}, dict(pingpong=True),
        "... its three warpgroups issuing their GEMMs in turns: 0.942-0.979x (poly) / 0.982-0.993x (native) "
        "the time causal (32 heads, GQA 4 packed and MHA, S 2k-16k), 1.000x / 0.990x non-causal (S = 4k); "
        "a causal 1024-key window 0.930-0.975x (poly), a ragged packed batch 0.988x / 0.995x; keep words "
        "on top 0.94-1.01x: not taken", "fwd-three-warpgroups-turns"),
    Row({"mode": "softcap", "fixed_max_ok": True, "head_dim": 128}, dict(balance_ctas=False),
        "the 192-row tile on every SM: the balance model's count took 1.01-1.03x the time (causal MHA)",
        "fwd-persistent-ctas"),
    Row({"exp2_offload": True, "fixed_max_ok": True}, dict(exp2_fma="from_split"),
        "the exp2 offload's columns take 2^a on the FMA pipe where the constant max bounds a",
        "softcap-exp2-offload"),
    Row({"head_dim": 64}, dict(tile_m=192, tile_n=128, num_stages=3, pingpong=False),
        "three consumer warpgroups, tile 192 x 128, 3 K/V stages: 0.90-0.93x the 128 x 128 tile at D = 64",
        "fwd-d64-tile"),
    Row({"head_dim": 64}, dict(balance_ctas=False),
        "every SM: the balance model is not timed on the 192-row tile at D = 64 (it missed at "
        "softcap D = 128's)", "fwd-persistent-ctas"),
    Row({"head_dim": 64, "varlen": False, "causal": True}, dict(pingpong=True, mask_bits=True, o_smem=True),
        "the three warpgroups issue their GEMMs in turns, masked blocks by keep words, O staged "
        "through smem: 0.86-0.99x the time at causal D = 64 (S 512 to 8k, every mode; non-causal "
        "not timed, and its sigmoid poly build spills 4 words)", "fwd-d64-turns"),
    Row({"head_dim": 64, "varlen": False, "causal": False}, dict(pingpong=True, o_smem=True),
        "non-causal D = 64 (no masked blocks, so no keep words): turns and O staging, 0.95-0.99x the time "
        "(softmax, softcap poly; S 512 to 32k)", "fwd-d64-turns"),
    Row({"head_dim": 64, "varlen": False, "causal": False, "mode": "sigmoid"}, dict(pingpong=False),
        "... but sigmoid without the turns: O staging alone 0.936-0.984x (poly) / 0.984-1.005x (native) the "
        "time (GQA 4 and MHA, S 1k-16k), with the turns 0.955-0.995x; the poly build's 3 spilled words sit "
        "in the prologue and the per-tile epilogue, none in a key-block loop", "fwd-d64-sigmoid-osmem"),
    Row({"head_dim": 64, "varlen": False, "causal": False, "mode": "sigmoid", "short_keys": True, "window": False},
        dict(pingpong=True),
        "... up to 2k keys with the turns after all: 0.975-0.985x (poly) / 0.948-0.985x (native) the time "
        "(MHA S 512-2k, GQA 4 at 1k; two runs at S <= 1k); 4k 1.007x (poly)", "fwd-d64-sigmoid-turns-short"),
    Row({"head_dim": 64, "varlen": False, "causal": False, "window": True}, dict(mask_bits=True),
        "a non-causal window has masked blocks: with the compare per score the 192-row build spills "
        "39-97 words (every mode, left or two-sided windows), with keep words none", "fwd-d64-window-keep-words"),
    Row({"head_dim": 64, "varlen": False, "causal": True, "short_seq": True},
        dict(tile_m=128, num_stages=2, pingpong=False, mask_bits=False),
        "short causal D = 64 sequences (S_q, S_k <= SHORT_SEQLEN) on two 64-row warpgroups, 2 stages, "
        "no turns or keep words (O staged): 0.84-0.97x the 192-row tile (32 heads, GQA 4 and MHA, S "
        "512 and 1k, every mode); at S = 2k 0.99-1.11x, non-causal 0.99-1.09x", "fwd-d64-short"),
    # packed GQA where it was timed faster (fwd-pack-gqa): the 192-row tiles (48 positions of 4 heads
    # end fewer tiles mid key block) and a KV head's query heads in one tile (K / V read once for them)
    Row({"head_dim": 64, "mode": "softmax", "varlen": False, "short_seq": False, "window": False,
         "pack_gqa_ok": True}, dict(pack_gqa=True),
        "D = 64 softmax with the GQA group packed into the 192-row tile: 0.915 / 0.950 / 0.974-1.029 / "
        "0.927-0.969 / 0.984x the time at causal S = 2k / 4k / 8k / 16k / 32k (32/8), non-causal 0.965-0.981x",
        "fwd-pack-gqa"),
    Row({"head_dim": 64, "mode": "softcap", "fixed_max_ok": True, "causal": True, "varlen": False,
         "short_seq": False, "window": False, "pack_gqa_ok": True}, dict(pack_gqa=True),
        "... and the causal D = 64 softcap under the constant max: 0.921 / 0.935x at S = 2k / 4k, 0.984-1.016x "
        "from 8k (non-causal 0.932 / 1.019x: not taken)", "fwd-pack-gqa"),
    Row({"head_dim": 64, "mode": "sigmoid", "causal": True, "varlen": False, "short_seq": False, "window": False,
         "pack_gqa_ok": True, "pack_gqa_keys": True}, dict(pack_gqa=True),
        "... and the causal D = 64 sigmoid up to PACK_GQA_MAX_KEYS keys: poly 0.921 / 0.932 / 0.943x, native "
        "0.944 / 0.978 / 0.978x the time at S = 2k / 4k / 8k (32/8); 16k / 32k were mixed", "fwd-pack-gqa"),
    Row({"head_dim": 128, "mode": "softcap", "fixed_max_ok": True, "varlen": False, "window": False,
         "pack_gqa_ok": True}, dict(pack_gqa=True),
        "D = 128 softcap under the constant max (its 192 x 64 tile): 0.872-0.948x the time (32/8, causal S 1k "
        "to 16k, non-causal 4k), 1.001x at B = 1 S = 4k; softmax and sigmoid at D = 128, D = 256 and sigmoid at "
        "D = 64 were mixed (0.93-1.06x): unpacked", "fwd-pack-gqa"),
    Row({"head_dim": 128}, dict(o_smem=True),
        "O staged through smem, 16-byte row stores: 0.84-0.97x the time at S = 1k, 0.98-1.00x at 4k; "
        "0.95-0.96x on a ragged varlen batch", "fwd-o-smem"),
    Row({"head_dim": 128, "mode": "softcap", "fixed_max_ok": True, "mha": True, "short_keys": True,
         "varlen": False, "window": False}, dict(o_tma=True),
        "... and the softcap D = 128 forward's staged rows leave by TMA stores with a KV head per query head "
        "(GQA packs its group, which TMA's bounds do not clip): 0.961-0.997x the time (poly, S 512-2k, two "
        "runs); softmax and sigmoid were mixed (0.971-1.017x): row stores", "fwd-o-tma"),
    Row({"head_dim": 128, "varlen": True, "mode": "softcap", "window": True}, dict(o_smem=False),
        "... but not the windowed varlen softcap build (192 x 64): it spills 13 words with O staging "
        "(CPU SASS), none without", "fwd-o-smem"),
    # a second Q buffer: the persistent CTA's next Q loads while the current tile still reads its own
    # (one buffer is refilled only after the tile's last QK GEMM: docs/MEASURED.md fwd-s512-ncu)
    Row({"head_dim": 128, "mode": "softmax", "short_seq": True, "varlen": False, "window": False},
        dict(q_stages=2),
        "two Q buffers at short S: 0.953 / 0.960 / 0.986 / 0.997x the time (causal MHA S = 512, GQA S = 512, "
        "MHA S = 1k, GQA S = 1k), non-causal S = 512 0.988x; S = 2k 1.003x, 4k 1.008x", "fwd-q-stages"),
    Row({"head_dim": 128, "mode": "sigmoid", "short_seq": True, "varlen": False, "window": False},
        dict(q_stages=2), "... sigmoid poly 0.934-0.990x (same cells); 2k 1.002x, 4k 0.996x", "fwd-q-stages"),
    Row({"head_dim": 64, "mode": "softmax", "short_keys": True, "varlen": False, "window": False},
        dict(q_stages=2),
        "D = 64 up to 2k keys: 0.914-0.972x (causal MHA / GQA S 512-2k, packed GQA at 2k, non-causal S = 512)",
        "fwd-q-stages"),
    Row({"head_dim": 64, "mode": "sigmoid", "short_keys": True, "varlen": False, "window": False},
        dict(q_stages=2), "... sigmoid poly 0.920-0.970x", "fwd-q-stages"),
    Row({"head_dim": 64, "mode": "softcap", "fixed_max_ok": True, "mha": True, "short_keys": True,
         "varlen": False, "window": False},
        dict(q_stages=2),
        "... softcap under the constant max with a KV head per query head: 0.915-0.960x (S = 512, causal and "
        "not), 0.969-1.004x (1k), 0.972-0.989x (2k); GQA 4 at 1k took 1.016-1.019x (poly): one buffer",
        "fwd-q-stages"),
    Row({"head_dim": 64, "mode": "softmax", "causal": True, "short_seq": True, "varlen": False, "window": False},
        dict(num_stages=3),
        "... and 3 K / V stages beside the two Q buffers at causal S <= 1k: 0.982-0.992x (MHA S = 512 / 1k, "
        "GQA 1k; two runs); non-causal S = 512 1.001x, causal 2k 0.999x", "fwd-d64-short-stages"),
    Row({"head_dim": 64, "mode": "sigmoid", "causal": True, "short_seq": True, "varlen": False, "window": False},
        dict(num_stages=3),
        "... sigmoid poly 0.955-0.992x (same cells); causal 2k 1.048x", "fwd-d64-short-stages"),
    Row({"head_dim": 64, "mode": "softmax", "causal": True, "short_seq": True, "varlen": False, "window": False},
        dict(mask_bits=True),
        "... with the masked blocks by keep words: 0.942 / 0.995 / 0.980x the time (MHA S = 512, MHA 1k, GQA "
        "1k); sigmoid poly 1.028 / 1.000 / 0.993x: not taken", "fwd-d64-short-keep-words"),
    Row({"head_dim": 64, "mode": "softcap", "fixed_max_ok": True, "mha": True, "causal": True, "short_seq": True,
         "varlen": False, "window": False}, dict(mask_bits=True),
        "... softcap under the constant max, MHA: 0.988 / 0.994x (poly, S = 512 / 1k), 0.974 / 0.982x "
        "(native); second run 0.993 / 0.996x, 0.976 / 0.978x", "fwd-d64-short-keep-words"),
    # the LPT order's L2 sections: smaller ones where each head's K / V would otherwise be re-read from DRAM
    # (non-causal: equal tiles, every SM; causal: a CTA count that walks whole sections per round)
    Row({"head_dim": 128, "mode": "softmax", "mha": True, "causal": False, "l2_section_keys": True,
         "varlen": False, "window": False}, dict(l2_section_mb=16),
        "non-causal MHA up to 512 keys in 16 MB sections: 0.910x the time (4 / 8 MB 0.908 / 0.913x; the 32/8 "
        "call 0.996-1.001x)", "fwd-l2-section"),
    Row({"head_dim": 128, "mode": "sigmoid", "mha": True, "causal": False, "l2_section_keys": True,
         "varlen": False, "window": False}, dict(l2_section_mb=16), "... sigmoid poly 0.906x", "fwd-l2-section"),
    Row({"head_dim": 64, "mode": "softmax", "mha": True, "causal": False, "l2_section_keys": True,
         "varlen": False, "window": False}, dict(l2_section_mb=16),
        "... D = 64: 0.959x (4 / 8 MB 0.949 / 0.953x)", "fwd-l2-section"),
    Row({"head_dim": 64, "mode": "sigmoid", "mha": True, "causal": False, "l2_section_keys": True,
         "varlen": False, "window": False}, dict(l2_section_mb=16), "... D = 64 sigmoid poly 0.976x", "fwd-l2-section"),
    Row({"head_dim": 128, "mode": "softmax", "mha": True, "causal": True, "short_seq": True, "varlen": False,
         "window": False}, dict(l2_section_mb=8, balance_ctas="sections"),
        "causal MHA at S <= 1k: 8 MB sections on 128 CTAs (whole sections per round): 0.862x (S = 512) / "
        "0.986x (1k); 16 MB on 128 CTAs 0.876-0.884x at 512, on 132 CTAs 1.28x; at 2k 1.022x, GQA 1.017x",
        "fwd-l2-section"),
    Row({"head_dim": 128, "mode": "sigmoid", "mha": True, "causal": True, "short_seq": True, "varlen": False,
         "window": False}, dict(l2_section_mb=8, balance_ctas="sections"),
        "... sigmoid poly 0.849x / 0.955x (2k 0.996x)", "fwd-l2-section"),
    Row({"head_dim": 64, "mode": "softmax", "mha": True, "causal": True, "short_seq": True, "varlen": False,
         "window": False}, dict(l2_section_mb=8, balance_ctas="sections"),
        "... D = 64 (its short 128-row tile, 132 CTAs before): 0.985x (S = 512) / 0.966x (1k); 2k 1.015x",
        "fwd-l2-section"),
    Row({"head_dim": 64, "mode": "sigmoid", "mha": True, "causal": True, "short_seq": True, "varlen": False,
         "window": False}, dict(l2_section_mb=8, balance_ctas="sections"),
        "... D = 64 sigmoid poly 0.909x / 0.957x (2k 1.005x)", "fwd-l2-section"),
    Row({"head_dim": 128, "mode": "softcap", "fixed_max_ok": True, "short_keys": True, "varlen": False,
         "window": False}, dict(l2_section_mb=16),
        "softcap D = 128 (192 x 64 tile, every SM) up to 2k keys in 16 MB sections: 0.944-0.994x the time "
        "(MHA causal and not, S 512-2k, GQA 32/8 causal 1k and non-causal 512, poly and native; two runs)",
        "fwd-l2-section-softcap"),
    Row({"head_dim": 64, "mode": "softcap", "fixed_max_ok": True, "mha": True, "causal": True, "short_seq": True,
         "l2_section_keys": False, "varlen": False, "window": False}, dict(balance_ctas="sections"),
        "softcap D = 64 causal MHA from 513 keys to SHORT_SEQLEN (its short 128-row tile) on 128 CTAs "
        "(whole sections per round): 0.956-0.966x at S = 1k (two runs); S = 512 1.009-1.016x, 2k 1.023x, "
        "GQA 1k 1.009x: not taken", "fwd-l2-section-softcap"),
    Row({"head_dim": 256, "mode": "softmax", "small_group": True, "short_seq": True, "varlen": False,
         "window": False}, dict(l2_section_mb=8, balance_ctas="sections"),
        "D = 256 at S <= 1k, causal and not: 8 MB sections on a CTA count that walks whole sections "
        "per round: MHA non-causal 0.848x (S = 512) / 0.932x (1k) the time, causal 0.987x / 0.985x (8 MB on "
        "132 CTAs 0.88-1.25x, 16 MB 0.97-1.05x; second run 0.853 / 0.921x, 1.029 / 0.957x); GQA 16/8 "
        "non-causal 0.875 / 0.938x, causal 0.933 / 0.963x (one run)", "fwd-l2-section-d256"),
    Row({"head_dim": 256, "mode": "softcap", "fixed_max_ok": True, "small_group": True, "short_seq": True,
         "varlen": False, "window": False}, dict(l2_section_mb=8, balance_ctas="sections"),
        "... softcap poly: MHA non-causal 0.871x / 0.960x, causal 0.982x / 0.974x (second run 0.868 / "
        "0.938x, 1.024 / 0.958x); GQA 16/8 non-causal 0.910 / 0.950x, causal 0.935 / 0.909x", "fwd-l2-section-d256"),
    Row({"head_dim": 256, "mode": "sigmoid", "mha": True, "causal": False, "short_seq": True,
         "varlen": False, "window": False}, dict(l2_section_mb=8, balance_ctas="sections"),
        "... sigmoid poly MHA non-causal 0.843x / 0.907x (one run; causal 1.051 / 0.968x: not taken)",
        "fwd-l2-section-d256"),
    Row({"head_dim": 256}, dict(o_smem=True),
        "O staged through a 128-column smem tile in two passes: 0.74-0.97x the time at D = 256 "
        "(S 512 to 4k, causal or not); 0.85-0.94x on a ragged varlen batch", "fwd-o-smem"),
    Row({"mode": "softcap", "fixed_max_ok": False, "head_dim": 64},
        dict(tile_m=128, num_stages=2, pingpong=False, mask_bits=False, o_smem=False),
        "softcap under the online max (cap > 50, FP16) spills on the 192-row causal tile: 128 rows, "
        "without the turns, keep words and O staging (timed on the 192-row tile only)", "fwd-d64-turns"),
    Row({"mode": "softcap", "fixed_max_ok": False, "head_dim": 64, "poly_score": True}, dict(pingpong=True),
        "with a packed program's score: ping-pong, as at the other head dims", "fwd-pingpong"),
    Row({"exp2_offload": True, "head_dim": 256}, dict(pingpong=True),
        "the exp2 offload at D = 256 with ping-pong", "fwd-d256-tile-n80"),
    Row({"exp2_offload": True, "head_dim": 256, "causal": False}, dict(tile_n=80, o_smem=False),
        "... non-causal in 80-key blocks, 0.915x the 64-key tile (native softcap keeps 64: 80 took "
        "1.016x), which has no room for O staging (64 keys with staging took 1.023x); causal keeps 64 "
        "keys and stages O: 0.72-0.92x the 80-key tile", "fwd-d256-tile-n80"),
    Row({"exp2_offload": True, "head_dim": 256, "causal": False, "varlen": False, "window": False,
         "short_keys": True}, dict(tile_n=64, o_smem=True),
        "... but up to SHORT_KEYS keys the 64-key tile with O staged: 0.836-0.931x the 80-key tile's "
        "time at S 512 / 1k, 0.963-0.965x at 2k, 1.029x at 4k (16/8 and 16/16 heads)", "fwd-d256-short-keys"),
    # each consumer warpgroup on its own rows' key range (wg_skip): where a tile's warpgroup has blocks to
    # pass, i.e. 192-row tiles ending mid-sequence or cut by the causal diagonal, and 64-key blocks at D = 256
    Row({"head_dim": 128, "mode": "softcap", "fixed_max_ok": True, "mha": True, "short_keys": True,
         "varlen": False, "window": False}, dict(wg_skip=True),
        "each consumer warpgroup runs only the key blocks its own rows see (host count: the 192 x 64 tile's "
        "warpgroups ran 1.42 / 1.35x the blocks their rows need at causal S = 512 / 1k): causal MHA S = 512 / "
        "1k / 2k 0.854 / 0.854 / 0.976x the time (poly), 0.846 / 0.849 / 0.966x (native), non-causal S = 512 / "
        "1k 0.931 / 0.972x, 0.914 / 0.983x (H200, one run); packed GQA 4 at 1k 1.012 / 0.994x: not taken",
        "fwd-wg-skip"),
    Row({"head_dim": 64, "mode": "softmax", "mha": True, "short_keys": True, "varlen": False, "window": False},
        dict(wg_skip=True), "... D = 64 on the 192 x 128 tile: causal S = 2k 0.984x, non-causal S = 512 0.964x",
        "fwd-wg-skip"),
    Row({"head_dim": 64, "mode": "softcap", "fixed_max_ok": True, "mha": True, "short_keys": True, "varlen": False,
         "window": False}, dict(wg_skip=True), "... softcap poly 0.937x / 0.918x", "fwd-wg-skip"),
    Row({"head_dim": 64, "causal": True, "short_seq": True}, dict(wg_skip=False),
        "... but not on the short causal 128 x 128 tile, which has no block to pass (D = 128's 128 x 128 tile "
        "with the skip's prologue alone: 1.006-1.011x)", "fwd-wg-skip"),
    Row({"head_dim": 256, "mode": "softmax", "causal": True, "mha": True, "short_seq": True, "varlen": False,
         "window": False}, dict(wg_skip=True),
        "... causal D = 256 softmax (128 x 64: the first warpgroup passes the diagonal's top block): S = 512 / "
        "1k 0.977 / 0.973x; softcap poly 1.029 / 1.064x: not taken", "fwd-wg-skip"),
    # causal query tiles aligned to S_q's end (q_bottom): the partial tile is the first, the one with the
    # fewest key blocks, instead of the last; it changes what a 192-row tile costs where S_q is no multiple of it
    Row({"head_dim": 128, "mode": "softcap", "fixed_max_ok": True, "causal": True, "window": False},
        dict(q_bottom=True),
        "causal query tiles aligned to S_q's end (host count: the 192 x 64 tile's warpgroup-blocks 0.836 / 0.945x "
        "at S = 1k / 4k): softcap D = 128 MHA S = 1k / 2k / 4k 0.979 / 0.949-0.967 / 0.932-0.954x the time "
        "(H100), 4k / 8k 0.939-0.949 / 0.974-0.985x (H200); packed GQA 4 1k / 4k 0.948-0.977 / 0.982-0.998x; "
        "ragged varlen 0.939 / 0.962x (poly / native, H100)", "fwd-q-bottom"),
    Row({"head_dim": 128, "mode": "softcap", "fixed_max_ok": True, "causal": True, "window": True, "mha": False,
         "varlen": False}, dict(q_bottom=True),
        "... and causal with a left window where a KV head serves several query heads (Gemma-2-27B's local "
        "layers, 32/16, S = 8192): windows 4095 / 1023 0.985-0.987 / 0.987-0.998x poly, 0.988-0.991 / 0.990-0.991x "
        "native, two H100 runs (MHA 0.983-1.008x: not taken; host count 0.990 / 0.993)", "fwd-q-bottom"),
    Row({"head_dim": 128, "mode": "softcap", "q_bottom_rows": False}, dict(q_bottom=False),
        "... but not at S_q <= Q_BOTTOM_MIN_SEQLEN_Q: MHA S = 512 1.011-1.026x (poly), 1.011-1.014x (native), "
        "two H100 runs (no warpgroup-block saved there)", "fwd-q-bottom"),
    Row({"head_dim": 64, "causal": True, "short_seq": False, "varlen": False, "window": False},
        dict(q_bottom=True),
        "... D = 64's 192 x 128 tile: MHA S = 2k / 4k softmax 0.982 / 0.954-0.957x, softcap poly 0.975 / "
        "0.910-0.941x, sigmoid 0.954 / 0.945-0.949x; 8k 1.002-1.005 / 0.902-0.923 / 1.025-1.040x; GQA 32/8 4k "
        "softmax 0.961-0.992x, sigmoid 0.924-0.931x (a user score function's hooks see the real rows: ALiBi bit for "
        "bit with and without the shift)", "fwd-q-bottom"),
    Row({"head_dim": 64, "mode": "softcap", "mha": False}, dict(q_bottom=False),
        "... but not D = 64 softcap with its GQA group packed: 1.015 / 1.049x at 4k", "fwd-q-bottom"),
    Row({"head_dim": 64, "mode": "sigmoid", "q_bottom_keys": False}, dict(q_bottom=False),
        "... nor D = 64 sigmoid past Q_BOTTOM_MAX_KEYS keys: 1.025 / 1.040x at 8k", "fwd-q-bottom"),
    Row({"varlen": True}, dict(varlen=True, persistent=True),
        "packed sequences: one persistent launch over (sequence, head) units, tiles past a "
        "sequence's end skipped: 1.04-1.22x a CTA per tile on a ragged batch", "varlen-grid"),
    Row({"varlen": True, "head_dim": 64}, dict(tile_m=128, num_stages=2),
        "D = 64 varlen keeps 128 rows where the dense tile was not timed (sigmoid, non-causal, short "
        "sequences, softcap under the online max)", "varlen-d64-tiles"),
    Row({"varlen": True, "head_dim": 64, "causal": True, "short_seq": False, "mode": "softmax"}, D64_PACKED_FWD,
        "... causal softmax on the dense D = 64 tile (192 rows, 3 stages, turns, keep words, O staged): "
        "1.080x the 128-row tile's speed on 8 x 4k equal lengths, 1.086x on a ragged batch", "varlen-d64-tiles"),
    Row({"varlen": True, "head_dim": 64, "causal": True, "short_seq": False, "mode": "softcap",
         "fixed_max_ok": True}, D64_PACKED_FWD,
        "... and softcap under the constant row max: 1.147x equal, 1.055x ragged", "varlen-d64-tiles"),
    Row({"varlen": True, "head_dim": 64, "causal": True, "short_seq": False, "mode": "sigmoid"}, D64_PACKED_FWD,
        "... and sigmoid: 1.241x equal, 1.176x ragged (at its default bias: the native score adding each "
        "sequence's -ln S_k)", "varlen-d64-tiles"),
    Row({"varlen": True, "head_dim": 64, "causal": True, "short_seq": False, "mode": "softmax", "window": False,
         "pack_gqa_ok": True},
        dict(pack_gqa=True),
        "... with the GQA group packed into the 192-row tile: softmax 1.057x the speed on 8 x 4k equal lengths, "
        "1.003x ragged", "varlen-pack-gqa"),
    Row({"varlen": True, "head_dim": 64, "causal": True, "short_seq": False, "mode": "softcap", "fixed_max_ok": True,
         "window": False, "pack_gqa_ok": True}, dict(pack_gqa=True),
        "... softcap 1.001x equal, 1.051x ragged (D = 128 packed calls: 0.961-1.028x, unpacked)", "varlen-pack-gqa"),
    Row({"varlen_ragged": True}, dict(varlen_compact=True),
        "ragged packed batches walk only the live (query tile, sequence) pairs, longest first: 1.01-1.05x "
        "the slot order there; equal lengths keep the slot order (the compact one took 1.04-1.08x its time)",
        "varlen-compact"),
)

# the backward's stagger (p_turns + dq_defer): dq_defer needs the staged dQ halves, p_turns follows
# dq_defer (resolve); the calls it was timed on: built-in scores, non-deterministic, unwindowed
STAGGER = dict(p_turns="with_dq_defer", dq_defer="with_dq_halves")
_STAGGER_CALLS = {"deterministic": False, "user_score": False, "window": False}

BWD_ROWS = (
    Row({}, dict(tile_m=64, tile_n=128, stages=2, deterministic=False, swap=False),
        "64 query x 128 key tiles, 2 Q/dO stages: P^T and dS^T stay at 32 registers per thread", ""),
    Row({}, dict(dq_async=True, dq_halves=False, dp_first=False),
        "dQ staged in smem and added by warp 1's bulk reductions: 0.76-0.79x the red.global path "
        "(one buffer for both warpgroups)", "bwd-dq-async"),
    Row({}, dict(lpt=True), "LPT-ordered CTAs: 0.90-0.94x blockIdx order", "bwd-lpt"),
    Row({}, dict(p_turns=False, dq_defer=False),
        "both MMA warpgroups run their P blocks at once and issue a query block's dQ once the whole dS tile "
        "is in smem (the DS_READY barrier keeps them in step); the stagger below pays only where the P "
        "block's MUFU work outweighs its dP^T (D = 64, softcap)", "bwd-step-order"),
    Row({}, dict(head_loop="grid_fills", zero_dq_in_pre=True),
        "a CTA per KV head over its GQA group where that grid has >= 1.5 CTAs per SM; its dQ "
        "accumulator zeroed by the pre kernel", "bwd-head-loop"),
    Row({}, dict(kv_sections="long_rows", dkv_smem="with_head_loop"),
        "head_loop builds stage dK / dV through the K / V tiles (0.93-1.02x the time, 0.97x softmax "
        "at causal GQA S = 4k); with long rows, LPT in L2-sized sections of KV heads (MHA 0.64x at "
        "non-causal S = 32k, 0.81x at 16k, 0.95x causal 16k; GQA non-causal S = 32k 0.915-0.971x; "
        "1.36x at causal GQA B=1 S=4k, hence never causal GQA)",
        "bwd-kv-sections"),
    Row({"mode": "sigmoid"}, dict(zero_dq_in_pre=False),
        "sigmoid has no pre kernel otherwise: a memset is cheaper than launching it to zero dQ",
        "bwd-zero-dq"),
    Row({"head_dim": 256}, dict(stages=1, dq_async=False, dp_first=True),
        "D = 256 in column chunks: full-D Q, dO, K, V and dS take 225 of 227 KB: one Q/dO stage, no staged "
        "dQ; dP^T first and dO released after dV, so the next dO loads under dK / dQ and Q under dP^T: "
        "0.91-0.95x the S^T-first order (dense, softmax and softcap poly, GQA / MHA, causal or not, S 1k-16k; "
        "a ragged packed batch 0.943-0.951x)",
        "bwd-d256-dp-first"),
    Row({"head_dim": 256, "deterministic": False, "user_score": False, "swap_grid_small": False},
        dict(swap=True, tile_n=64, stages=2, head_loop=True, dp_first=False),
        "D = 256 with a built-in score: the swapped build (a CTA per 64 keys of a KV head owns all "
        "256 columns, dK^T / dV^T with the head dim on M, no recompute): 0.79-0.86x the chunked build's "
        "time (softmax, softcap poly; GQA / MHA, causal or not, S 1k-16k, the Gemma-2 2B shape), packed "
        "sequences 0.85-0.88x (a ragged batch, 16/8); but where its grid is under one wave and the chunked "
        "per-query-head grid over one (swap_grid_small), the chunked build: 0.73-0.80x the swapped one "
        "there (B=1, 8/4 heads, S 1280-2048)", "bwd-d256-swap"),
    Row({"head_dim": 64, "deterministic": False, "user_score": False, "varlen": False}, dict(tile_m=128),
        "D = 64: 128 query rows per step (the dS factor packed to FP16 beside P): 0.93-0.98x the "
        "64-row step", "bwd-d64-tile-m128"),
    Row({"head_dim": 64, "mode": "softcap", "poly_score": True}, dict(tile_m=64),
        "... but not under the packed tanh program (caps above 50, or named): its backward's FP16 dS "
        "factor beside the program's derivative spills 63-87 words on the 128-row step (CPU SASS; never "
        "timed there), none on the 64-row step", "bwd-d64-softcap-program"),
    Row({"head_dim": 64, "deterministic": False, "user_score": False, "varlen": False}, dict(dq_halves="with_dq_async"),
        "... its staged dQ tile as two warpgroup halves, each behind its own barriers and bulk add: "
        "0.94-0.99x the one buffer (every mode, GQA and MHA, causal or not); it follows the resolved "
        "step (an override of dq_async takes it along)", "bwd-dq-halves"),
    Row({"head_dim": 128}, dict(dq_halves="with_dq_async"),
        "D = 128 (64-row step): the warpgroups' column halves of the staged dQ tile, a bulk add per "
        "16-row band each: 0.930-0.996x the one buffer (every mode, GQA 4 and MHA, causal or not, "
        "S 512 to 16k; packed ragged batches on the per-KV-head loop 0.956-0.967x)", "bwd-dq-halves"),
    Row({**_STAGGER_CALLS, "head_dim": 64, "varlen": False, "long_keys": True}, STAGGER,
        "D = 64 from STEP_ORDER_MIN_SEQLEN_K keys: the warpgroups staggered, P blocks in turns behind named "
        "barriers and each one's dQ issued a step late behind per-buffer mbarriers: 0.886-0.946x the time "
        "(softmax, softcap poly, sigmoid poly; MHA and GQA, causal or not, S 2k-16k; mask_fsel 0.93x, p_turns "
        "alone 0.98-1.05x); 0.99x at S = 1k, 1.04x at 512", "bwd-step-order"),
    Row({**_STAGGER_CALLS, "head_dim": 128, "mode": "softcap", "varlen": False}, STAGGER,
        "... and the D = 128 softcap (its tanh derivative keeps the dS math long): 0.971-0.980x in 5 of 6 "
        "cells (1.002x once; MHA and GQA, causal or not, S 1k-16k); softmax and sigmoid at D = 128 "
        "1.00-1.04x; windowed calls keep the order in step (correct there, not timed)",
        "bwd-step-order"),
    Row({**_STAGGER_CALLS, "window": True, "head_dim": 64, "varlen": False, "long_keys": True, "mode": "softmax"},
        STAGGER, "D = 64 windowed calls stagger too: 0.959x the in-step time (softmax; a causal window of 256 "
        "keys, GQA 32/8 B=4 S=4k)", "bwd-step-order"),
    Row({**_STAGGER_CALLS, "window": True, "head_dim": 64, "varlen": False, "long_keys": True, "mode": "softcap"},
        STAGGER, "... softcap poly 0.947x (at D = 128 0.996-1.001x: windowed D = 128 stays in step)", "bwd-step-order"),
    Row({**_STAGGER_CALLS, "head_dim": 64, "varlen": False, "long_keys": False, "mode": "softcap", "causal": False,
         "exp2_offload": True},
        STAGGER, "D = 64 softcap poly (the exp2 offload) below STEP_ORDER_MIN_SEQLEN_K keys, non-causal: 0.941x "
        "(S = 512) / 0.900x (1k) the in-step time (MHA 32 heads); the in-step build spills 19 words, the staggered 5",
        "bwd-step-order"),
    # packed calls (the stagger needs the staged dQ halves, which packed calls take on the
    # per-KV-head loop only: on a CTA per query head the warpgroups stay in step)
    Row({**_STAGGER_CALLS, "varlen": True, "head_dim": 128, "mode": "softmax"}, STAGGER,
        "packed D = 128 softmax: 0.963x the in-step order (8 x 4k equal lengths), 0.981x (24 ragged, "
        "32k tokens)", "bwd-step-order-packed"),
    Row({**_STAGGER_CALLS, "varlen": True, "head_dim": 128, "mode": "softcap"}, STAGGER,
        "... softcap: 0.935x equal, 0.959x ragged", "bwd-step-order-packed"),
    Row({**_STAGGER_CALLS, "varlen": True, "head_dim": 64, "mode": "softmax", "long_keys": True},
        dict(STAGGER, dq_halves="with_dq_async"),
        "packed D = 64 (the 64-row step) with its dQ halves: softmax 0.927x equal, 0.957x ragged",
        "bwd-step-order-packed"),
    Row({**_STAGGER_CALLS, "varlen": True, "head_dim": 64, "mode": "softcap", "long_keys": True},
        dict(STAGGER, dq_halves="with_dq_async"),
        "... softcap: 0.870x equal, 0.892x ragged (packed sigmoid not timed: in step)", "bwd-step-order-packed"),
    Row({**_STAGGER_CALLS, "varlen": True, "head_dim": 64, "mode": "softmax", "long_keys": True, "causal": True},
        dict(tile_m=128),
        "packed D = 64 on the dense 128-row step (its halves, the stagger): 1.208x the 64-row step's speed "
        "on 8 x 4k equal lengths, 1.171x ragged", "varlen-d64-tiles"),
    Row({**_STAGGER_CALLS, "varlen": True, "head_dim": 64, "mode": "softcap", "long_keys": True, "causal": True,
         "poly_score": False},
        dict(tile_m=128), "... softcap (not the tanh program: its 128-row step spills): 1.102x equal, 1.102x ragged "
        "(causal; non-causal packed calls keep the 64-row step, not timed)",
        "varlen-d64-tiles"),
    Row({**_STAGGER_CALLS, "varlen": True, "head_dim": 64, "mode": "sigmoid", "long_keys": True, "causal": True},
        dict(STAGGER, dq_halves="with_dq_async", tile_m=128),
        "... sigmoid on the same step (its backward score is native's): 1.373x equal, 1.256x ragged",
        "varlen-d64-tiles"),
    Row({"deterministic": True}, dict(deterministic=True, dq_async=False, lpt=False, head_loop=False),
        "ordered adds need the launch order and the MMA threads' own adds", "bwd-deterministic"),
    Row({"deterministic": True, "head_dim": 256}, dict(dp_first=False),
        "... in S^T-first order: dp_first took 1.001-1.033x the time in the deterministic D = 256 build "
        "(its turns, not the loads, bound the block)", "bwd-d256-dp-first"),
    Row({}, dict(varlen=False), "dense calls: no packed sequences", ""),
    Row({"varlen": True}, dict(varlen=True, varlen_order="unit"),
        "packed sequences: one pre, main and post launch, a CTA per key block, query head and sequence; "
        "the table in unit order (sequence, head, key block): sorted by work as the dense LPT grid it "
        "took 1.50-1.67x the time on equal lengths, 1.34-1.45x on a ragged batch", "varlen-bwd-lpt"),
    Row({"varlen": True, "varlen_ragged": False}, dict(varlen_order="block"),
        "... equal lengths in block order (each sequence's key blocks ascending, heads fastest, in the dense "
        "grid's sections): 1.023-1.076x the unit order's speed (softmax, softcap poly; D 64 and 128, 8 x 4k); "
        "ragged batches keep the unit order (block 0.970-1.006x there)", "varlen-bwd-block-order"),
    Row({"varlen": True, "varlen_tables_fit": False}, dict(varlen=False),
        "the CTA table's int32 entries hold up to 2^18 sequences of up to 2^19 keys: beyond, each "
        "sequence runs as its own dense launch", ""),
    Row({"varlen": True, "deterministic": True}, dict(varlen=False),
        "ordered dQ adds need the dense launch order: each sequence runs as its own dense launch", ""),
)

# the longest sequence (query or key) the short-sequence forward rows take
SHORT_SEQLEN = 1024
# the longest key range of the short-key forward rows (the non-causal D = 256 exp2 offload's 64-key
# blocks with O staged; D = 64's second Q buffer): there the per-tile costs outweigh the loop's
SHORT_KEYS = 2048
# the longest key range of the non-causal MHA forward's 16 MB L2 sections (fwd-l2-section): at 512
# keys a 128-row tile reads its head's whole K / V for 4 key blocks of work, and with the 32 MB
# sections each head's K / V is back in use only after ~32 MB of other heads' (one tile per head and
# round: re-read from DRAM, more bytes per second than HBM gives: bench/tools/l2_order.py); at 1k keys the
# same order was no slower in one run of two
L2_SECTION_MAX_KEYS = 512
# the key length from which the D = 64 backward staggers its warpgroups (p_turns + dq_defer): the
# stagger's prologue and last deferred dQ are paid once per CTA, its gain once per query block
STEP_ORDER_MIN_SEQLEN_K = 2048
# the longest keys at which the causal D = 64 sigmoid forward packs its GQA group (fwd-pack-gqa: faster
# at 2k-8k, mixed at 16k and 32k)
PACK_GQA_MAX_KEYS = 8192
# the longest keys at which D = 64 sigmoid took fwd.q_bottom (faster at 2k and 4k, slower at 8k: fwd-q-bottom)
Q_BOTTOM_MAX_KEYS = 4096
# the longest query length at which the softcap D = 128 forward keeps its tiles aligned to S_q's start:
# at 512 rows the shift saves no warpgroup-block (host count) and took 1.011-1.026x the time (fwd-q-bottom)
Q_BOTTOM_MIN_SEQLEN_Q = 512
# head_loop where its grid (key blocks x KV heads x batch x column chunks) has this many CTAs per SM
HEAD_LOOP_MIN_CTAS_PER_SM = 1.5
# kv_sections ("long_rows"): the key length from which sections pay, per (causal, MHA); below it
# one LPT section balances the causal tail better than L2-sized sections save DRAM traffic; at
# causal GQA never (None): each section's longest causal blocks start behind the previous one's
KV_SECTIONS_MIN_SEQLEN = {(False, True): 4096, (True, True): 16384, (False, False): 32768, (True, False): None}


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class AttnPlan:
    """A resolved call: what the forward and the backward kernels build and run."""
    call: AttnCall
    score: Any                 # forward side: a kernels.scores.ScoreSpec
    score_bwd: Any             # backward side (the exp2 offload's and sigmoid's product rule's are native's)
    fwd: Any                   # kernels.config.FwdConfig
    bwd: Any                   # kernels.config.BwdConfig
    window: tuple              # runtime (left, right) window sizes (kernels/config.window_sizes)
    zero_dq_in_pre: bool       # the pre kernel zeroes the dQ accumulator (head_loop builds)
    varlen_bwd_order: Optional[str]   # packed calls: the backward's CTA table order (tile_scheduler.
                                      # varlen_bwd_table); None for dense calls
    softmax_scale: float
    softcap: Optional[float]
    sigmoid_bias: Optional[float]   # sigmoid: the resolved bias (default -ln S_k; packed calls at the
                                    # default: 0, the kernels add each sequence's -ln S_k, score.seq_bias)
    fwd_ctas: int = 0          # the persistent forward's CTA count (runtime; <= fwd.persistent)
    l2_section_mb: int = 32    # the forward's LPT sections: query heads whose K and V rows fit this many
                               # MB of L2 (runtime: kernels/tile_scheduler.py section_heads)


def _apply(rows, facts, out: dict) -> dict:
    for r in rows:
        if r.matches(facts):
            out.update(r.sets)
    return out


def _program_spec(program):
    from .asm import programs
    if program is None or isinstance(program, programs.ProgramSpec):
        return program
    return programs.spec(program)


def _varlen_tables_fit(call: AttnCall) -> bool:
    """The varlen kernels' tile tables (the forward's compact order, the backward's CTAs) encode
    (block, sequence) in one int32 word (kernels/tile_scheduler.py): sequences and blocks within its
    bits, counted in the smallest block a varlen kernel takes (the swapped D = 256 backward's 64
    keys), so that every varlen build fits whatever the backward rows pick."""
    from .kernels.config import COMPACT_MAX_SEQS, COMPACT_MAX_TILES
    return call.batch <= COMPACT_MAX_SEQS and -(-max(call.seqlen_q, call.seqlen_k) // 64) <= COMPACT_MAX_TILES


def _facts(call: AttnCall, program) -> dict:
    cap = call.softcap if call.softcap is not None else 0.0
    return {
        "mode": call.mode, "evaluator": call.evaluator, "dtype": call.dtype, "head_dim": call.head_dim,
        "causal": call.causal, "deterministic": call.deterministic, "varlen": call.varlen,
        "window": call.window[0] >= 0 or (call.window[1] >= 0 and not call.causal),
        "varlen_tables_fit": call.varlen and _varlen_tables_fit(call),
        "varlen_ragged": call.varlen and call.varlen_ragged and _varlen_tables_fit(call),
        "short_seq": max(call.seqlen_q, call.seqlen_k) <= SHORT_SEQLEN,
        # the forward can pack the GQA group into its M tile (kernels/config.check_fwd: a power of two
        # up to 64, dense calls of the built-in scores)
        "pack_gqa_ok": _pack_gqa_ok(call),
        "pack_gqa_keys": call.seqlen_k <= PACK_GQA_MAX_KEYS,
        "long_keys": call.seqlen_k >= STEP_ORDER_MIN_SEQLEN_K,
        "short_keys": call.seqlen_k <= SHORT_KEYS,
        "q_bottom_keys": call.seqlen_k <= Q_BOTTOM_MAX_KEYS,
        "q_bottom_rows": call.seqlen_q > Q_BOTTOM_MIN_SEQLEN_Q,
        "l2_section_keys": call.seqlen_k <= L2_SECTION_MAX_KEYS,
        # a K / V head per query head: the K / V bytes a query tile reads are its head's alone
        "mha": call.heads_q == call.heads_kv,
        "small_group": call.heads_q <= 2 * call.heads_kv,   # MHA or a KV head per two query heads
        "fixed_max_ok": call.mode == "softcap" and call.dtype == "bf16" and 0.0 < cap <= FIXED_MAX_CAP,
        "program_dtype": None if program is None else program.dtype,
        "exp2_offload": program is not None and program.is_exp2,
        # the score runs a packed-pair program on its poly columns (the exp2 offload does not:
        # its score is native softcap with part of the exp2s on the FMA pipe)
        "user_score": call.score_mod is not None,
        "poly_score": call.evaluator == "poly" and call.mode != "softmax" and call.score_mod is None
                      and not (program is not None and program.is_exp2),
    }


def _swap_grid_small(call: AttnCall, sm_count: int) -> bool:
    """D = 256: the swapped backward's grid (a CTA per 64 keys, KV head and sequence) is under one
    CTA per SM while the chunked build's per-query-head grid (a CTA per 128 keys, query head,
    sequence and 128-column chunk) is over one: there the chunked build's parallelism wins
    (packed sequences: both grids counted as if every sequence had the longest one's keys)
    (docs/MEASURED.md bwd-d256-swap: 0.73-0.80x at B=1 8/4 heads S 1280-2048; at 128 chunked CTAs
    it took 1.66-1.93x, at 1k 16/8 1.00x)."""
    if call.head_dim != 256:
        return False
    swap_ctas = -(-call.seqlen_k // 64) * call.heads_kv * call.batch
    chunked_ctas = -(-call.seqlen_k // 128) * call.heads_q * call.batch * 2
    return swap_ctas < sm_count < chunked_ctas


def _coarsen(split: tuple, key_block: int) -> tuple:
    """A split's period (8k keys) must repeat inside the forward's key block, so the forward
    sends the same key columns through the block as the backward's per-key rule: (1, 16) ->
    (1, 8) for 64-key blocks."""
    from .kernels.scores import split_fits_block
    j, k = split
    if split_fits_block(split, key_block):
        return split
    k_max = key_block // 8
    return (max(1, j * k_max // k), k_max)


def _score_specs(call: AttnCall, tile_n: int, facts: dict, overrides: Mapping):
    """(forward ScoreSpec, backward ScoreSpec): the same function, program and split; the exp2
    offload's backward is native's (same logits from MUFU tanh, P within 7.5e-5 relative)."""
    from .kernels.scores import ScoreSpec
    if call.score_mod is not None:
        spec = ScoreSpec(kind="user", evaluator="native", user=call.score_mod, aux=call.aux)
        return spec, spec
    if call.mode == "softmax":
        spec = ScoreSpec(kind="softmax", evaluator="native")
        return spec, spec
    program = facts["program"]
    # packed sigmoid calls at the default bias: b = -ln S_k of each sequence, added in the kernels
    seq = dict(seq_bias=True) if call.mode == "sigmoid" and call.varlen and call.sigmoid_bias is None else {}
    if call.evaluator == "native":
        spec = ScoreSpec(kind=call.mode, evaluator="native", **seq)
        return spec, spec
    if program.is_exp2:   # the exp2 offload: every tanh on MUFU, a native softcap score
        fwd = ScoreSpec(kind="softcap", evaluator="native", program=program)
        return fwd, ScoreSpec(kind="softcap", evaluator="native")
    split = overrides.get("poly_split") or _apply(SPLIT_ROWS, facts, {})["poly_split"]
    split = _coarsen(tuple(split), tile_n) if "poly_split" not in overrides else tuple(split)
    grad = _apply(GRAD_ROWS, dict(facts, program_dtype=program.dtype), {})
    rule = grad.get("softcap_grad") if call.mode == "softcap" else (call.sigmoid_grad or grad.get("sigmoid_grad"))
    rule = overrides.get("grad_rule", rule)
    if call.mode == "sigmoid" and rule == "surrogate" and "fwd_bwd" not in program.roles:
        # the surrogate backward runs the program's coupled value / derivative block
        from .asm import programs
        have = [n for n in programs.names(mode="sigmoid", derivative=False) if "fwd_bwd" in programs.spec(n).roles]
        raise ValueError(f"sigmoid_grad='surrogate' needs a sigmoid program with a coupled value / derivative "
                         f"block (a <name>_grad entry); the program {program.name!r} has none: pass "
                         f"program= one of {have}, or sigmoid_grad='product'")
    mufu = dict(mufu_above=SIGMOID_MUFU_ABOVE) if call.mode == "sigmoid" else {}
    spec = ScoreSpec(kind=call.mode, evaluator="poly", program=program, poly_split=split, grad_rule=rule, **seq,
                     **mufu)
    if call.mode == "sigmoid" and rule == "product":
        # sigma' = p (1 - p) of P recomputed on MUFU (the native build): the program's P error
        # reached dV past the rule (docs/MEASURED.md sigmoid-bwd-native-p); the surrogate's
        # coupled block recomputes P with the program (the same spec)
        return spec, ScoreSpec(kind="sigmoid", evaluator="native", **seq)
    return spec, spec


def resolve_sigmoid_bias(call: AttnCall) -> Optional[float]:
    """The sigmoid bias a call runs with: the user's, else b = -ln S_k (keeps sum_j sigma(x_ij + b)
    near 1); None for the other modes."""
    if call.mode != "sigmoid":
        return None
    return call.sigmoid_bias if call.sigmoid_bias is not None else -math.log(call.seqlen_k)


def sigmoid_program_fits(program, bias: float) -> bool:
    """Whether a sigmoid_attn program (fitted at n) is used inside its fitted span: b + ln n in
    SIGMOID_FIT_SPAN."""
    d = bias + math.log(program.n)
    return SIGMOID_FIT_SPAN[0] <= d <= SIGMOID_FIT_SPAN[1]


def poly_outside_rule(call: AttnCall, program) -> Optional[str]:
    """Why a packed program would miss the FlashAttention error rule (error <= 2x torch's at the
    input precision, tests/rule_harness.py) on this call, or None.  Measured on the H200
    (bench/results/correctness.md, docs/MEASURED.md poly-rule-domain): the exp2 offload (BF16
    softcap under the constant max) and the sigmoid program on BF16 inputs inside its bias span
    pass; the packed tanh program on FP16 inputs misses by up to 3.6x on O and 30x on the LSE,
    the sigmoid program on FP16 inputs by up to 3.1x, and outside its span (S_k = 1 at the
    default bias, b + ln 4096 = 8.3) on BF16 too.  (BF16 softcap with caps above 50, the tanh
    program's default, is not in the measured grid.)"""
    if call.mode == "softcap" and call.dtype == "fp16" and not program.is_exp2:
        return ("on FP16 inputs the packed tanh program's logit error exceeds 2x torch's FP16 "
                "attention error (O up to 3.6x, LSE 30x)")
    if call.mode == "sigmoid":
        if call.dtype == "fp16":
            return "on FP16 inputs its error exceeds 2x torch's FP16 attention error (up to 3.1x)"
        bias = resolve_sigmoid_bias(call)
        if program.n and call.varlen and call.sigmoid_bias is None and not sigmoid_program_fits(program, 0.0):
            # packed sequences at the default bias: each sequence's -ln S_k, S_k from 1 up (the
            # lengths are on the device), and b = 0 at S_k = 1 is past the span
            low = math.ceil(program.n * math.exp(-SIGMOID_FIT_SPAN[1]))
            return (f"it is fitted for bias -ln {program.n}; packed sequences at the default bias -ln S_k "
                    f"leave its span (b + ln n in {SIGMOID_FIT_SPAN}) for any sequence of fewer than {low} keys")
        if program.n and not sigmoid_program_fits(program, bias):
            return (f"it is fitted for bias -ln {program.n}; bias {bias:.3g} is outside its span "
                    f"(b + ln n in {SIGMOID_FIT_SPAN})")
    return None


def resolve(call: AttnCall, sm_count: int, overrides: Optional[Mapping] = None) -> AttnPlan:
    """The plan of a call on a GPU with sm_count SMs.  overrides: FwdConfig / BwdConfig fields as
    "fwd.<field>" / "bwd.<field>" keys, "poly_split", "grad_rule" for the score, "fwd_ctas" for
    the persistent forward's CTA count and "l2_section_mb" for its LPT sections' size (runtime
    values; timing tools and tests); checked like the defaults
    (kernels.config.check_fwd / check_bwd)."""
    from .kernels.config import VARLEN_BWD_ORDERS, BwdConfig, FwdConfig, check_bwd, check_fwd, fwd_smem_fits
    overrides = dict(overrides or {})
    program = None
    if call.evaluator == "poly" and call.mode in ("softcap", "sigmoid") and call.score_mod is None:
        facts0 = _facts(call, None)
        name = call.program if call.program is not None else _apply(PROGRAM_ROWS, facts0, {}).get("program")
        program = _program_spec(name)
        why = "no default program" if program is None else poly_outside_rule(call, program)
        if why and call.program is None:   # the default program: the native score instead
            call, program = dataclasses.replace(call, evaluator="native"), None
        elif why:                          # a named program runs as asked, with the reason
            import warnings
            warnings.warn(f"{call.mode} program {program.name!r}: {why}", stacklevel=3)
    facts = _facts(call, program)
    facts["program"] = program
    facts["swap_grid_small"] = _swap_grid_small(call, sm_count)
    unknown = sorted(k for k in overrides
                     if not (k.startswith(("fwd.", "bwd.")) or k in ("poly_split", "grad_rule", "fwd_ctas",
                                                                     "l2_section_mb")))
    if "fwd.l2_section_mb" in overrides:
        raise ValueError("fwd.l2_section_mb: the LPT sections' size is a runtime plan value, no FwdConfig "
                         "field: override 'l2_section_mb'")
    if unknown:
        raise ValueError(f"unknown plan overrides {unknown}: use 'fwd.<FwdConfig field>', "
                         "'bwd.<BwdConfig field>', 'poly_split', 'grad_rule', 'fwd_ctas' or 'l2_section_mb'")

    # ---- forward
    fwd = _apply(FWD_ROWS, facts, {})
    if fwd["exp2_fma"] == "from_split":   # the exp2 offload: its split in groups of 8 out of 8
        j, k = tuple(overrides["poly_split"]) if "poly_split" in overrides else \
            _apply(SPLIT_ROWS, facts, {})["poly_split"]
        if 8 % k or not 0 < 8 * j // k <= 8:
            raise ValueError(f"the exp2 offload runs j/k of the key columns in groups of 8 out of 8: "
                             f"k must divide 8 and 0 < j, got poly_split {(j, k)}")
        fwd["exp2_fma"] = 8 * j // k
    for k_, v in overrides.items():
        if k_.startswith("fwd."):
            fwd[k_[4:]] = v
    if fwd["persistent"] is True:
        fwd["persistent"] = sm_count
    elif fwd["persistent"] is False:
        fwd["persistent"] = 0
    if fwd["q_stages"] > 1 and "fwd.q_stages" not in overrides and not (fwd["persistent"] and fwd_smem_fits(
            fwd["tile_m"], fwd["tile_n"], fwd["num_stages"], call.head_dim, fwd["o_smem"], fwd["q_stages"])):
        fwd["q_stages"] = 1   # the row's second Q buffer: persistent CTAs only, and where it fits (overrides)
    fwd["pack_gqa"] = _pack_gqa(call, fwd["pack_gqa"])
    if fwd["pack_gqa"] > 1 and call.varlen and fwd["varlen_compact"]:
        # the compact table counts tiles of tile_m / pack_gqa positions: refused here, not at the launch
        from .kernels.tile_scheduler import table_levels
        table_levels(call.batch, call.seqlen_q, fwd["tile_m"] // fwd["pack_gqa"], "fwd.pack_gqa (the compact order)")
    if fwd["varlen"]:
        if not call.varlen:
            raise ValueError("fwd.varlen: the varlen forward runs packed calls (flash_attn_poly.varlen)")
    if fwd["fixed_max"] and not facts["fixed_max_ok"]:
        raise ValueError(f"fixed_max (a constant row max c - 20) needs mode='softcap', BF16 inputs and "
                         f"0 < softcap <= {FIXED_MAX_CAP} (beyond, P leaves FP32's normal range), got "
                         f"mode={call.mode!r}, {call.dtype}, softcap={call.softcap}")
    balance_ctas = fwd.pop("balance_ctas")
    l2_mb = overrides.get("l2_section_mb", fwd.pop("l2_section_mb"))
    if isinstance(l2_mb, bool) or not isinstance(l2_mb, int) or not 1 <= l2_mb <= 1024:
        raise ValueError(f"l2_section_mb (MB of K and V per LPT section) must be an integer in [1, 1024], "
                         f"got {l2_mb!r}")
    wl, wr = call.window
    has_l = wl >= 0
    has_r = wr >= 0 and not call.causal
    score, score_bwd = _score_specs(call, fwd["tile_n"], facts, overrides)
    if fwd["exp2_fma"] and "fwd.exp2_program" not in overrides:
        # the offload's block is the score's exp2 program; beside a tanh program or native tanh it
        # was slower or less accurate (docs/MEASURED.md fwd-tanh-program-split), so only by name
        if score.program is None or not score.program.is_exp2:
            raise ValueError(f"fwd.exp2_fma: its block is the score's exp2 program ({EXP2_PROGRAM!r}, the BF16 "
                             f"softcap poly default under the constant max); this call's score has "
                             f"{'no program' if score.program is None else repr(score.program.name)}: "
                             f"pass 'fwd.exp2_program' too to run an exp2_f32 program beside it")
        fwd["exp2_program"] = score.program
    try:
        fwd_cfg = FwdConfig(score=score, dtype=call.dtype, head_dim=call.head_dim, causal=call.causal,
                            window_left=has_l, window_right=has_r, **fwd)
    except TypeError as e:
        raise ValueError(f"plan overrides: {e}") from None
    check_fwd(fwd_cfg)

    # ---- backward
    bwd = _apply(BWD_ROWS, facts, {})
    if bwd["head_loop"] == "grid_fills":
        chunks = max(1, call.head_dim // 128)
        ctas = -(-call.seqlen_k // bwd["tile_n"]) * call.heads_kv * call.batch * chunks
        bwd["head_loop"] = call.heads_q == call.heads_kv or ctas >= HEAD_LOOP_MIN_CTAS_PER_SM * sm_count
    for k_, v in overrides.items():
        if k_.startswith("bwd."):
            bwd[k_[4:]] = v
    if bwd["varlen"]:   # structural: a CTA per entry of the (key block, head, sequence) table
        if not call.varlen or call.deterministic:
            raise ValueError("bwd.varlen: the varlen backward runs packed calls (flash_attn_poly.varlen), "
                             "not deterministic")
        # the per-KV-head loop where the grid fills (the head_loop row's rule, measured on packed
        # batches: docs/MEASURED.md varlen-head-loop); dQ's accumulator is zeroed by
        # backward_varlen's own memset (zeroing it in the varlen pre kernel gained nothing:
        # docs/MEASURED.md varlen-zero-dq-in-pre)
        if overrides.get("bwd.zero_dq_in_pre"):
            raise ValueError("bwd.zero_dq_in_pre: packed calls zero the dQ accumulator by a memset; the "
                             "varlen pre kernel has no zeroing build")
        bwd.update(head_loop=bool(bwd["head_loop"]), lpt=False, zero_dq_in_pre=False)
    # the head_loop refinements follow the resolved loop (an override of head_loop or lpt takes
    # them along); kv_sections orders the LPT grid, which packed calls do not have (lpt off above)
    if bwd["kv_sections"] == "long_rows":
        min_k = KV_SECTIONS_MIN_SEQLEN[(call.causal, call.heads_q == call.heads_kv)]
        bwd["kv_sections"] = bool(bwd["head_loop"] and bwd["lpt"] and min_k is not None and call.seqlen_k >= min_k)
    if bwd["dkv_smem"] == "with_head_loop":
        bwd["dkv_smem"] = bool(bwd["head_loop"])
    if bwd["dq_halves"] == "with_dq_async":
        # packed calls: on the per-KV-head loop only, the varlen build that was timed and GPU-tested
        # with the halves (tests/test_varlen_gpu.py BWD_BUILDS)
        bwd["dq_halves"] = bool(bwd["dq_async"] and (bwd["head_loop"] or not bwd["varlen"]))
    if bwd["dq_defer"] == "with_dq_halves":   # the deferred dQ goes to this warpgroup's own staged half
        bwd["dq_defer"] = bool(bwd["dq_halves"])
    if bwd["p_turns"] == "with_dq_defer":   # the stagger is both together (p_turns alone: 0.98-1.05x)
        bwd["p_turns"] = bool(bwd["dq_defer"])
    zero_dq_rule = bwd.pop("zero_dq_in_pre")
    varlen_order = bwd.pop("varlen_order", None)   # set by the packed calls' row (dense calls have no table)
    if varlen_order is not None and varlen_order not in VARLEN_BWD_ORDERS:
        raise ValueError(f"bwd.varlen_order: one of {VARLEN_BWD_ORDERS}, got {varlen_order!r}")
    try:
        bwd_cfg = BwdConfig(score=score_bwd, dtype=call.dtype, head_dim=call.head_dim, causal=call.causal,
                            window_left=has_l, window_right=has_r, **bwd)
    except TypeError as e:
        raise ValueError(f"plan overrides: {e}") from None
    check_bwd(bwd_cfg)

    # ---- runtime values
    bias = 0.0 if score.seq_bias else resolve_sigmoid_bias(call)   # seq_bias: the kernels add -ln S_k
    from .kernels.config import window_sizes
    zero_dq = bwd_cfg.head_loop and zero_dq_rule
    window = window_sizes(call.window, call.causal, call.seqlen_q, call.seqlen_k)
    return AttnPlan(call=call, score=score, score_bwd=score_bwd, fwd=fwd_cfg, bwd=bwd_cfg,
                    window=window, zero_dq_in_pre=zero_dq, varlen_bwd_order=varlen_order,
                    softmax_scale=call.softmax_scale,
                    softcap=call.softcap, sigmoid_bias=bias,
                    fwd_ctas=_fwd_ctas(call, fwd_cfg, window, balance_ctas, l2_mb, overrides.get("fwd_ctas")),
                    l2_section_mb=l2_mb)


def _pack_gqa_ok(call: AttnCall) -> bool:
    from .kernels.config import pack_gqa_fits
    g = call.heads_q // call.heads_kv
    return g > 1 and pack_gqa_fits(g) and call.score_mod is None


def _pack_gqa(call: AttnCall, value) -> int:
    """fwd.pack_gqa as the kernel takes it: the call's GQA group (H_q / H_kv) for True, 1 (off) for
    False or an MHA call; an integer must be 1 or the call's group."""
    group = call.heads_q // call.heads_kv
    if isinstance(value, bool):
        return group if value else 1
    if value not in (1, group):
        raise ValueError(f"fwd.pack_gqa: 1 (off) or the call's GQA group H_q / H_kv = {group}, got {value!r}")
    return int(value)


def _fwd_ctas(call: AttnCall, fwd, window, balance: bool, l2_mb: int, override: Optional[int]) -> int:
    """The persistent forward's CTA count: with `balance` (the balance_ctas row) on dense calls
    the count (of at most fwd.persistent) whose snake over the sectioned LPT order the host model
    balances best (kernels/tile_scheduler.persistent_ctas; docs/MEASURED.md fwd-persistent-ctas);
    balance "sections": a count that divides every section's tiles, so each round of the snake
    walks whole sections (tile_scheduler.section_ctas; fwd-l2-section), else the model's;
    else, and on varlen calls (which walk their own order), fwd.persistent.  override: the count
    itself (timing tools, tests)."""
    if override is not None:
        if fwd.persistent <= 0 or not 0 < override <= fwd.persistent:
            raise ValueError(f"fwd_ctas: the persistent grid's CTA count, 1 to fwd.persistent "
                             f"({fwd.persistent}), got {override}")
        return int(override)
    if fwd.persistent <= 0 or call.varlen or not balance:
        return fwd.persistent
    from .kernels.tile_scheduler import TILE_FIXED_KEYS, heads_per_section, persistent_ctas, section_ctas
    from .kernels.mask import key_block_range, q_bottom_shift
    tm, tn, s_q, s_k, g = fwd.tile_m, fwd.tile_n, call.seqlen_q, call.seqlen_k, fwd.pack_gqa
    num_blocks = -(-(g * s_q) // tm)   # packed GQA: tiles of tm / g positions of g heads, per KV head
    cost = []
    s_qv = s_q + q_bottom_shift(s_q, tm // g) if fwd.q_bottom else s_q   # q_bottom: positions in front of the first tile
    for m in range(num_blocks):   # key blocks per query block, as the kernel's BlockRange counts them
        n_min, n_max = key_block_range(m, s_qv, s_k, tm // g, tn, fwd.causal, fwd.window_left, fwd.window_right,
                                       *window)
        cost.append(max(n_max - n_min, 0) * tn + TILE_FIXED_KEYS)
    units = call.heads_q // g * call.batch
    group = heads_per_section(units, s_k, call.head_dim * 4, call.heads_q // call.heads_kv // g,
                              l2_mb << 20)
    if balance == "sections":
        aligned = section_ctas(fwd.persistent, num_blocks, units, group)
        if aligned:
            return aligned
    return persistent_ctas(fwd.persistent, num_blocks, units, group, cost, fwd.causal)


# ---------------------------------------------------------------- the flash-attn-4 backend
# attention(backend="fa4") runs flash-attn-4's kernels with our score functions
# (flash_attn_poly/fa4.py); backend="auto" picks it where our sm_90 kernels cannot run and
# FA4 can (Blackwell), on sm_90 only when asked.
FA4_AUTO_ARCHS = ((10, 0), (10, 3))           # B200/GB200, B300/GB300
FA4_ARCHS = ((9, 0),) + FA4_AUTO_ARCHS        # FA4's score_mod paths (sm_80 has none)
FA4_HEAD_DIMS = (64, 96, 128)                 # FA4 4.0.0b36's standard range on sm_90 and sm_100

FA4_ROWS = (
    Row({"mode": "softcap", "evaluator": "poly"}, {"program": "softcap_c50_f16_odd"},
        "the FP16 odd tanh program on every score pair: no MUFU.TANH, the ex2 stays FA4's", ""),
    Row({"mode": "sigmoid", "evaluator": "poly"}, {"program": "sigmoid_attn_n4096_f16"},
        "sigma from the FP16 program, then ln on MUFU: FA4 normalises, O * exp(LSE) undoes it", ""),
)


@dataclass(frozen=True)
class Fa4Plan:
    """A call on flash-attn-4: the score function fa4.score_mods builds (flash_attn_poly/fa4.py)."""
    call: AttnCall
    score: str                  # "softmax" | "softcap" | "sigmoid" | "user"
    program: Any                # poly: an asm.programs.ProgramSpec; native: None
    grad_rule: Optional[str]    # softcap poly: "value" | "block"; else None
    softmax_scale: float
    softcap: Optional[float]
    sigmoid_bias: Optional[float]


def resolve_fa4(call: AttnCall) -> Fa4Plan:
    """The FA4 plan of a validated call: the score (program by FA4_ROWS, a program the call names
    otherwise; softcap's grad rule by GRAD_ROWS; a sigmoid program outside its fitted bias span
    runs native, as in resolve) and the runtime scalars."""
    score = "user" if call.score_mod is not None else call.mode
    program = grad_rule = None
    bias = resolve_sigmoid_bias(call)
    if call.evaluator == "poly" and score in ("softcap", "sigmoid"):
        name = call.program if call.program is not None else _apply(FA4_ROWS, _facts(call, None), {})["program"]
        program = _program_spec(name)
        if program.is_exp2 or "fwd" not in program.roles:
            raise ValueError(f"program {program.name!r}: FA4 takes {call.mode} programs with a forward block "
                             "(the exp2 offload is our sm_90 kernels'; FA4 runs its own exp2)")
        if score == "sigmoid" and program.n and not sigmoid_program_fits(program, bias):
            if call.program is not None:
                import warnings
                warnings.warn(f"sigmoid program {program.name!r} is fitted for bias -ln {program.n}; bias "
                              f"{bias:.3g} is outside its span (b + ln n in {SIGMOID_FIT_SPAN}): running the "
                              "native sigmoid", stacklevel=3)
            program = None
        if score == "softcap":
            grad_rule = _apply(GRAD_ROWS, dict(_facts(call, program), program_dtype=program.dtype),
                               {})["softcap_grad"]
            if grad_rule == "block" and "bwd" not in program.roles:
                grad_rule = "value"
    return Fa4Plan(call=call, score=score, program=program, grad_rule=grad_rule,
                   softmax_scale=call.softmax_scale, softcap=call.softcap, sigmoid_bias=bias)
