"""The timing tools' `--knob` text as plan overrides (flash_attn_poly.plan.resolve).

A knob is NAME=VALUE, several joined by '+' (e.g. `tile_n=64+num_stages=3`, `split=1/8+program=
softcap_c50_f16_odd`, `head_loop=0+lpt=1`):

  fwd.<field>=V, bwd.<field>=V     a FwdConfig / BwdConfig field (kernels/config.py), set after
                                   the plan's rows: "fwd.tile_n=64", "bwd.head_loop=0"
  <field>=V                        the same with the tool's direction implied: fwd_tuning,
                                   cta_overhead, ncu_fwd, poly_split read FwdConfig fields,
                                   bwd_tuning BwdConfig fields
  split=J/K (poly_split=J/K)       the poly score's key column split ("poly_split")
  grad_rule=R (softcap_grad=R)     the poly backward's derivative rule ("grad_rule")
  program=NAME, sigmoid_grad=R,    attention() arguments: the plan resolves from them (deterministic
  deterministic=0/1                turns off dq_async, lpt and head_loop by its row)
                                   (bwd also: zero_dq_in_pre=0/1, who zeroes head_loop's dQ
                                   accumulator, a plan choice with a "bwd." override)

Values: bool fields 0 / 1, int fields and persistent (a CTA count; 0 = a CTA per tile) ints,
float fields floats, the rest strings.  Overrides replace fields after the rows: set every field
you mean (a 128-key split at D = 128 under BF16 softcap's 64-key tile needs the tile too:
`tile_m=128+tile_n=128+num_stages=2+pingpong=1`); kernels/config.check_fwd / check_bwd name a
combination no kernel builds when the plan is resolved.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# call facts of the configs, not tunable (the plan takes them from the call)
_CALL_FIELDS = ("score", "dtype", "head_dim", "causal", "window_left", "window_right")
CALL_KNOBS = {"program": str, "sigmoid_grad": str, "deterministic": bool}   # plan_for keywords
# backward choices of the plan that are no BwdConfig field but take a "bwd." override
BWD_PLAN_FIELDS = {"zero_dq_in_pre": "bool"}   # who zeroes head_loop's dQ accumulator
ALIASES = {"split": "poly_split", "softcap_grad": "grad_rule"}
POLY_ONLY = ("poly_split", "grad_rule", "program", "sigmoid_grad")   # need evaluator="poly"


def _fields(direction: str) -> dict:
    """{field: type name} of the tunable FwdConfig ("fwd") / BwdConfig ("bwd") fields."""
    from flash_attn_poly.kernels.config import BwdConfig, FwdConfig
    cls = FwdConfig if direction == "fwd" else BwdConfig
    out = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.name not in _CALL_FIELDS}
    return out if direction == "fwd" else {**out, **BWD_PLAN_FIELDS}


@dataclass(frozen=True)
class Knob:
    text: str
    overrides: dict = field(default_factory=dict)   # plan.resolve overrides
    call: dict = field(default_factory=dict)        # testing.plan_for keywords

    @property
    def poly_only(self) -> bool:
        """Does the knob name the poly score (split, grad rule, program)?"""
        return any(k in POLY_ONLY for k in (*self.overrides, *self.call))


def _value(name: str, kind: str, value: str):
    if kind in ("bool", bool):
        if value not in ("0", "1"):
            raise ValueError(f"--knob {name}: expected 0 or 1, got {value!r}")
        return value == "1"
    try:
        if kind in ("int", int):
            return int(value)
        if kind in ("float", float):
            return float(value)
    except ValueError:
        raise ValueError(f"--knob {name}: expected {getattr(kind, '__name__', kind)}, got {value!r}") from None
    return value


def _split(name: str, value: str) -> tuple:
    j, sep, k = value.partition("/")
    try:
        return int(j), int(k)
    except ValueError:
        raise ValueError(f"--knob {name}: expected J/K (e.g. 1/8), got {value!r}") from None


def parse(text: str, direction: str = "fwd") -> Knob:
    """The Knob of `text`; bare field names are `direction`'s ("fwd" | "bwd")."""
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    fields = {d: _fields(d) for d in ("fwd", "bwd")}
    overrides, call = {}, {}
    for part in text.split("+"):
        name, sep, value = part.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"--knob {text!r}: expected NAME=VALUE[+NAME=VALUE...], got {part!r}")
        key = ALIASES.get(name, name)
        if key == "poly_split":
            overrides[key] = _split(name, value)
        elif key == "grad_rule":
            overrides[key] = value
        elif key in CALL_KNOBS:
            call[key] = _value(name, CALL_KNOBS[key], value)
        else:
            scope, dot, fname = key.partition(".")
            if not dot:
                scope, fname = direction, key
            if scope not in fields or fname not in fields[scope]:
                known = dict.fromkeys([*fields[direction], *ALIASES, "poly_split", "grad_rule", *CALL_KNOBS])
                raise ValueError(f"--knob {name}: unknown; known: {', '.join(known)} "
                                 "(or fwd.<FwdConfig field>, bwd.<BwdConfig field>)")
            overrides[f"{scope}.{fname}"] = _value(name, fields[scope][fname], value)
    return Knob(text, overrides, call)


def plan_for(q, k, v, mode: str, evaluator: str, knob: Knob = None, **kw):
    """The plan attention(q, k, v, mode, evaluator=, **kw) resolves, with the knob applied
    (flash_attn_poly.testing.plan_for; q, k, v may live on torch's meta device)."""
    from flash_attn_poly import testing
    knob = knob or Knob("")
    p = testing.plan_for(q, k, v, mode, evaluator, knob.overrides, **{**kw, **knob.call})
    exp2_offload = p.score.program is not None and p.score.program.is_exp2   # its split sets exp2_fma
    score_knobs = sorted(k for k in set(knob.overrides) & {"poly_split", "grad_rule"}
                         if not (k == "poly_split" and exp2_offload))
    if score_knobs and p.score.evaluator != "poly":
        # a native score has no block columns and a native backward: the knob would be dropped
        # and the row would time the default
        prog = p.score.program.name if p.score.program is not None else None
        raise ValueError(f"--knob {knob.text!r}: {', '.join(score_knobs)} applies to a poly score; "
                         f"{mode}/{evaluator} resolves to a native score (program {prog}): name a poly "
                         "program too, e.g. program=softcap_c50_f16_odd")
    return p

