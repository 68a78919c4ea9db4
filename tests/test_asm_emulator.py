"""CPU tests of the PTX emulator (op semantics against independent references) and of the
generated blocks (counts, immediates, bit-exact agreement with fit.runtime's fused replay)."""
import json
import os
import re
import warnings
from fractions import Fraction

import numpy as np
import pytest

from flash_attn_poly.asm import blocks as B
from flash_attn_poly.asm import emulator as em
from flash_attn_poly.asm import fpbits as fb
from flash_attn_poly.asm import programs as PG
import asm_reference as R

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "asm_programs.json")
RNG = np.random.default_rng(1234)


def tables():
    """The stand-in fixture always; the committed table when it exists."""
    out = [pytest.param(json.load(open(FIXTURE)), id="fixture")]
    try:
        out.append(pytest.param(PG.load_table(), id="programs.json"))
    except FileNotFoundError:
        pass
    return out


# ----------------------------------------------------------------------------- references
def frac_round(v: Fraction, fmt: fb.Fmt) -> float:
    """Independent RNE of an exact rational to fmt (Fractions only)."""
    if v == 0:
        return 0.0
    sign, a = (-1 if v < 0 else 1), abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = Fraction(2) ** (max(e, fmt.emin) - (fmt.p - 1))
    n, rem = divmod(a, q)
    if rem * 2 > q or (rem * 2 == q and n % 2 == 1):
        n += 1
    mag = n * q
    if mag >= Fraction(2) ** (fmt.emax + 1):
        return sign * np.inf
    return sign * float(mag)


def run1(op: str, *words, n_out=1):
    srcs = ", ".join(f"${n_out + i}" for i in range(len(words)))
    return em.execute(f"{{ {op} $0, {srcs}; }}", [np.asarray(w, np.uint32) for w in words], n_out)[0]


def random_halves(n, fmt, finite=True):
    bits = RNG.integers(0, 1 << 16, n).astype(np.uint32)
    if finite:
        bits = bits[np.isfinite(fb.decode(bits, fmt))]
    return bits


# ----------------------------------------------------------------------------- op semantics
@pytest.mark.parametrize("fmt", [fb.BF16, fb.F16], ids=["bf16", "f16"])
def test_fma_single_rounding_matches_fractions(fmt):
    n = 3000
    a, b, c = (random_halves(n, fmt)[:1500] for _ in range(3))
    # bias half of the triples to a*b ~ -c so cancellation and subnormal results occur
    av, bv, cv = (fb.decode(x, fmt) for x in (a, b, c))
    near = fb.encode(fb.round_to_format(-av * bv, 0.0, fmt), fmt)
    near_ok = np.isfinite(fb.decode(near, fmt))
    c = np.where((np.arange(len(c)) % 2 == 1) & near_ok, near, c)
    ptype = "bf16x2" if fmt is fb.BF16 else "f16x2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = fb.decode(run1(f"fma.rn.{ptype}", a, b, c) & 0xFFFF, fmt)
    cv = fb.decode(c, fmt)
    exp = np.array([frac_round(Fraction(x) * Fraction(y) + Fraction(z), fmt)
                    for x, y, z in zip(av, bv, cv)])
    assert np.array_equal(got, exp) or np.all((got == exp) | (np.isnan(got) & np.isnan(exp)))
    twice = fb.round_to_format(fb.round_to_format(av * bv, 0.0, fmt) + cv, 0.0, fmt)
    assert np.any(twice != exp), "no double-rounding case sampled: test would be vacuous"


@pytest.mark.parametrize("ptype,fmt,a,b", [
    ("bf16x2", fb.BF16, 1 + 2**-4, 1 + 2**-4),          # a*b = 1 + 2^-3 + 2^-8: a bf16 tie
    ("f16x2", fb.F16, 1 + 2**-5, 1 + 2**-6),            # 1 + 2^-5 + 2^-6 + 2^-11: an f16 tie
])
def test_fma_tie_broken_by_tiny_addend(ptype, fmt, a, b):
    """f64 a*b + c lands exactly on the tie; only the dropped tiny c decides the rounding."""
    ulp = 2.0 ** (1 - fmt.p)
    # bf16: 2^-100 is far below an f64 ulp of 1, so only TwoSum's error term carries it.
    # f16 cannot get there (finite results keep the f64 sum exact); 2^-24 still tests ties.
    tiny = 2.0**-100 if fmt is fb.BF16 else 2.0**-24
    words = [fb.encode(np.array([v]), fmt) for v in (a, b)]
    for c, direction in ((tiny, 1), (-tiny, -1), (0.0, 0)):
        cw = fb.encode(np.array([c]), fmt)
        got = fb.decode(run1(f"fma.rn.{ptype}", *words, cw) & 0xFFFF, fmt)[0]
        exact = Fraction(a) * Fraction(b) + Fraction(c)
        assert got == frac_round(exact, fmt)
        lo = np.floor((a * b - 1) / ulp) * ulp + 1
        assert got == {1: lo + ulp, -1: lo, 0: got}[direction]


def test_fma_specials():
    w = lambda *v: fb.encode(np.array(v, np.float64), fb.BF16)
    got = run1("fma.rn.bf16x2", w(np.inf, 0.0, 3e38, 1e-40), w(0.0, -0.0, 10.0, 1e-2),
               w(1.0, -0.0, 0.0, 0.0)) & 0xFFFF
    v = fb.decode(got, fb.BF16)
    assert got[0] == 0x7FFF                   # inf*0 -> canonical NaN
    assert v[1] == 0 and np.signbit(v[1])     # (+0)(-0) + (-0) = -0
    assert v[2] == np.inf                     # overflow -> inf
    assert v[3] == 0                          # underflow below half the smallest subnormal


def test_f32_nan_results_are_the_canonical_nan():
    """FP32 add / sub / mul / fma return the GPU's one FP32 NaN,
    0x7FFFFFFF, whatever the input NaN's bits (numpy's would be 0x7FC00000).  A block that reads
    a float's bits as an integer depends on it: the exp2_f32 block's exponent add (mad.lo.s32 of
    j = a + 1.5 * 2^23 into the polynomial) turns a NaN argument into FLT_MAX, 0x7F7FFFFF, as on
    the GPU (tests/test_nonfinite.py's offload-column case is its device side)."""
    nan = np.array([0x7FC00000, 0xFFC00001, 0x7F800001], np.uint32).view(np.float32)
    for text in ("add.rn.f32 $0, $1, 0f3F800000;", "mul.rn.f32 $0, $1, 0f40000000;",
                 "fma.rn.f32 $0, $1, 0f40000000, 0f3F800000;", "sub.rn.f32 $0, 0f3F800000, $1;"):
        assert (em.execute(text, [nan], 1)[0] == 0x7FFFFFFF).all(), text
    exp2 = B.block_for(PG.spec("exp2_f32_d3"), "exp2")
    got = em.run_block(exp2, np.array([np.nan, 0.0, 1.0], np.float32))[0]
    assert got[0] == 0x7F7FFFFF and got[1:].view(np.float32).tolist() == pytest.approx([1.0, 2.0], rel=1e-4)


@pytest.mark.parametrize("ptype,fmt", [("bf16x2", fb.BF16), ("f16x2", fb.F16)])
def test_cvt_pack_matches_reference(ptype, fmt):
    import torch

    x = RNG.standard_normal(20000).astype(np.float32) * np.float32(2.0) ** RNG.integers(
        -140, 120, 20000).astype(np.float32)
    x = np.concatenate([x, np.float32([np.inf, -np.inf, 0.0, -0.0, 3.4e38, 1e-45, 65519.0,
                                       65520.0, 2.0**-25, 2.0**-24 * 1.5])])
    y = x[::-1].copy()
    got = em.execute(f"{{ cvt.rn.{ptype}.f32 $0, $1, $2; }}", [x, y], 1)[0]
    if fmt is fb.BF16:
        ref = torch.from_numpy(np.stack([y, x])).bfloat16().view(torch.int16).numpy()
        ref = ref.astype(np.uint16).astype(np.uint32)
    else:
        ref = np.stack([y, x]).astype(np.float16).view(np.uint16).astype(np.uint32)
    assert np.array_equal(got & 0xFFFF, ref[0]) and np.array_equal(got >> 16, ref[1])
    nan = em.execute(f"{{ cvt.rn.{ptype}.f32 $0, $1, $2; }}",
                     [np.float32([np.nan]), np.float32([-np.nan])], 1)[0]
    assert nan[0] == 0x7FFF7FFF


@pytest.mark.parametrize("ptype,fmt", [("bf16x2", fb.BF16), ("f16x2", fb.F16)])
def test_min_max_nan_and_zero_rules(ptype, fmt):
    qnan, one, two = 0x7FC0 if fmt is fb.BF16 else 0x7E00, *fb.encode(np.array([1.0, 2.0]), fmt)
    neg_nan = qnan | 0x8000
    cases = [  # a, b, min, max
        (qnan, one, one, one), (one, neg_nan, one, one), (qnan, neg_nan, 0x7FFF, 0x7FFF),
        (one, two, one, two), (0x8000, 0x0000, 0x8000, 0x0000), (0x0000, 0x8000, 0x8000, 0x0000),
    ]
    a, b, mn, mx = (np.array(col, np.uint32) for col in zip(*cases))
    a2, b2 = fb.pack(a, b), fb.pack(b, a)      # also swapped in lane 1
    got_min, got_max = run1(f"min.{ptype}", a2, b2), run1(f"max.{ptype}", a2, b2)
    for k in (0, 1):
        assert np.array_equal(fb.lanes(got_min)[k], mn)
        assert np.array_equal(fb.lanes(got_max)[k], mx)
    x, y = random_halves(5000, fmt, finite=False)[:2000], random_halves(5000, fmt, False)[:2000]
    xv, yv = fb.decode(x, fmt), fb.decode(y, fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = np.fmin(xv, yv)
    got = fb.decode(run1(f"min.{ptype}", x, y) & 0xFFFF, fmt)
    assert np.all((got == ref) | (np.isnan(got) & np.isnan(ref)))


@pytest.mark.parametrize("cmp", ["eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu",
                                 "gtu", "geu", "num", "nan"])
def test_set_u32_per_lane(cmp):
    x, y = random_halves(4000, fb.BF16, False)[:1500], random_halves(4000, fb.BF16, False)[:1500]
    x[::7] = y[::7]                                   # some equal pairs
    xv, yv = fb.decode(x, fb.BF16), fb.decode(y, fb.BF16)
    nan = np.isnan(xv) | np.isnan(yv)
    base = {"eq": xv == yv, "ne": xv != yv, "lt": xv < yv, "le": xv <= yv, "gt": xv > yv,
            "ge": xv >= yv, "num": ~nan, "nan": nan}
    ref = base[cmp] if cmp in ("num", "nan") else (
        (base[cmp[:-1]] & ~nan) | nan if cmp.endswith("u") else base[cmp] & ~nan)
    got = run1(f"set.{cmp}.u32.bf16x2", fb.pack(x, y), fb.pack(y, x))
    assert np.array_equal(fb.lanes(got)[0], np.where(ref, 0xFFFF, 0))


def test_lop3_every_truth_table():
    a, b, c = (RNG.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    bit = np.arange(32, dtype=np.uint32)
    idx = (((a[:, None] >> bit) & 1) << 2) | (((b[:, None] >> bit) & 1) << 1) | ((c[:, None] >> bit) & 1)
    for lut in range(256):
        got = em.execute(f"{{ lop3.b32 $0, $1, $2, $3, {lut}; }}", [a, b, c], 1)[0]
        ref = (((lut >> idx) & 1).astype(np.uint64) << bit).sum(1).astype(np.uint32)
        assert np.array_equal(got, ref), lut


def test_integer_ops_and_packing():
    w = np.array([0x12345678, 0x80000001], np.uint32)
    assert list(run1("shl.b32", w, np.uint32([4, 4]))) == [0x23456780, 0x00000010]
    assert list(run1("shr.u32", w, np.uint32([4, 4]))) == [0x01234567, 0x08000000]
    assert list(run1("shr.s32", w, np.uint32([4, 4]))) == [0x01234567, 0xF8000000]
    assert list(run1("prmt.b32", w, np.uint32([0, 0]), np.uint32([0x1032, 0x1032]))) == \
        [0x56781234, 0x00018000]
    out = em.execute("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; mov.b32 $0, {hi, lo}; }", [w], 1)
    assert list(out[0]) == [0x56781234, 0x00018000]
    got = em.execute("{ .reg .b32 t; mov.b32 t, 0x3f80bf80; and.b32 t, t, 0x7fff7fff; "
                     "not.b32 $0, t; }", [], 1)[0]
    assert int(got) == (~0x3F803F80) & 0xFFFFFFFF


@pytest.mark.parametrize("text,needle", [
    ("{ ex2.approx.f32 $0, $1; }", "ex2.approx.f32"),
    ("{ fma.rn.ftz.bf16x2 $0, $1, $1, $1; }", "fma.rn.ftz.bf16x2"),
    ("{ min.NaN.bf16x2 $0, $1, $1; }", "min.NaN.bf16x2"),
    ("{ fma.rn.bf16x2 $0, $1, 0x3f803f80, $1; }", "immediate"),
    ("{ mov.b32 t, $1; mov.b32 $0, t; }", "'t'"),
    ("{ .reg .b32 t; mov.b32 $0, t; }", "read before written"),
])
def test_unsupported_is_named(text, needle):
    with pytest.raises(em.UnsupportedOp, match=re.escape(needle)):
        em.execute(text, [np.zeros(2, np.uint32)], 1)


# ----------------------------------------------------------------------------- blocks
def _b3_counts(table):
    """(fwd, coupled, expected counts): 17/3 and 22/4 with the committed design
    (runtime.FUSED_OPS["piecewise2"]): cvt, 2 mov + max/min clamp, mov + set mask, sub (u = xc -
    thr, reusing the thr register), 4 lop3, 3 fma, 2 squarings; coupled: + 2 lop3, fma, mul
    (g*g), mul (P*g^2).  No output movs.  A table without the shared shift and the squarings
    (the stand-in fixture) is one instruction shorter forward and two coupled: 16/3 and 20/4."""
    fwd, both = B.get_block("sigmoid_fwd", table), B.get_block("sigmoid_fwd_bwd", table)
    pr = PG.entry(B.SIGMOID_ATTN, table)["params"]
    full = bool(pr.get("shift") and pr.get("squarings"))
    return fwd, both, ((17, 3), (22, 4)) if full else ((16, 3), (20, 4))


def fwd_squarings(table):
    return int(PG.entry(B.SIGMOID_ATTN, table)["params"].get("squarings") or 0)


@pytest.mark.parametrize("table", tables())
def test_b3_counts(table):
    fwd, both, (want_fwd, want_both) = _b3_counts(table)
    assert (fwd.n_instructions, fwd.n_fma) == want_fwd
    assert (both.n_instructions, both.n_fma) == want_both
    ops = [ln.split()[0] for ln in fwd.lines]
    assert ops.count("cvt.rn.bf16x2.f32") == 1 and ops.count("set.ge.u32.bf16x2") == 1
    assert {"min.bf16x2", "max.bf16x2"} <= set(ops)
    assert [ln.split()[-1] for ln in fwd.lines if ln.startswith("lop3")].count("0xca") >= 4
    assert fwd.constraints() == "=r,f,f" and both.constraints() == "=r,=r,f,f"
    assert not any(ln.startswith("mov.b32 $") for ln in fwd.lines + both.lines)   # no copies
    assert ops.count("mul.rn.bf16x2") == fwd_squarings(table)


def _head_tail(table):
    """(block, head, tail); a table whose block ends in no squaring has no tail to split off."""
    if not fwd_squarings(table):
        pytest.skip(f"{B.SIGMOID_ATTN} of this table has no squarings: no head/tail split")
    full, _, _ = _b3_counts(table)
    return full, B.get_block("sigmoid_fwd_head", table), B.get_block("sigmoid_fwd_tail", table)


@pytest.mark.parametrize("table", tables())
def test_sigmoid_fwd_head_then_tail_is_the_block(table):
    """attn_fwd's overlapped step runs sigmoid_fwd as head (before P V retires) and tail (after):
    the pair must be the full block op for op, and bit for bit on all 65,536 patterns per
    lane, masked lanes included (the stage zeroes q, then 0 * 0 = +0 like the zeroed P)."""
    full, head, tail = _head_tail(table)
    assert (head.n_instructions, head.n_fma, tail.n_instructions, tail.n_fma) == (16, 3, 1, 0)
    assert tail.lines == ("mul.rn.bf16x2 $0, $1, $1",) and tail.constraints() == "=r,r"
    ops = lambda blk: [ln.split(" ", 1)[0] for ln in blk.lines]
    assert ops(head) + ops(tail) == ops(full)
    assert head.lines[:-1] == full.lines[:-2]     # same registers, immediates, order
    ins = R.block_inputs(full, "bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (p,) = em.run_block(full, *ins)
        (q,) = em.run_block(head, *ins)
        (pq,) = em.run_block(tail, q)
        for keep in (0xFFFF, 0xFFFF0000, 0):
            (pm,) = em.run_block(tail, q & np.uint32(keep))
            assert np.array_equal(pm, p & np.uint32(keep)), hex(keep)
    assert np.array_equal(pq, p)


@pytest.mark.parametrize("table", tables())
def test_cli_counts_cover_every_block(table, capsys):
    from flash_attn_poly.asm.__main__ import count

    counts = count(table)
    _, _, ((n_fwd, f_fwd), (n_both, f_both)) = _b3_counts(table)
    assert counts["sigmoid_fwd"] == {"instructions": n_fwd, "fma": f_fwd}
    assert counts["sigmoid_fwd_bwd"] == {"instructions": n_both, "fma": f_both}
    for name in B.MAIN_BLOCKS:
        if "error" in counts[name]:
            continue
        blk = B.get_block(name, table)
        assert counts[name] == {"instructions": blk.n_instructions, "fma": blk.n_fma}
        # at most 24 instructions per program evaluated (geglu_bwd runs the value and derivative)
        assert blk.n_fma >= 2 and blk.n_instructions <= 24 * len(blk.programs)


def _words(line):
    return [int(t, 16) for t in re.findall(r"0x[0-9a-f]{8}", line)]


def _bits(hexes):
    return [int(h, 16) for h in hexes]


@pytest.mark.parametrize("table", tables())
def test_piecewise_coefficients_decode_from_lop3_immediates(table):
    fwd = PG.entry(B.SIGMOID_ATTN, table)
    grad = PG.entry(B.SIGMOID_ATTN + "_grad", table)
    blk = B.get_block("sigmoid_fwd_bwd", table)
    sel = [_words(ln) for ln in blk.lines if ln.startswith("lop3") and ln.endswith("0xca")]
    pairs = [(w[1] & 0xFFFF, w[0] & 0xFFFF) for w in sel]      # (lo region, hi region)
    assert all(w[0] >> 16 == w[0] & 0xFFFF and w[1] >> 16 == w[1] & 0xFFFF for w in sel)
    sh = fwd["params"].get("shift")
    n_shift = 1 if sh and sh[0] != sh[1] else 0     # a shared shift needs no select
    coeff_pairs = pairs[n_shift:n_shift + 4]
    assert [p[0] for p in coeff_pairs] == _bits(fwd["coeffs_bits"][0])
    assert [p[1] for p in coeff_pairs] == _bits(fwd["coeffs_bits"][1])
    ab = pairs[n_shift + 4:]
    to16 = lambda v: int(fb.encode(np.array([v]), fb.BF16)[0])
    assert ab == [(to16(grad["params"]["a"][0]), to16(grad["params"]["a"][1])),
                  (to16(grad["params"]["b"][0]), to16(grad["params"]["b"][1]))]


@pytest.mark.parametrize("table", tables())
@pytest.mark.parametrize("name", ["sigmoid_bf16x2", "softcap_fwd", "softcap_bwd",
                                  "gelu_fwd_f16x2", "tanh_bwd_f16x2"])
def test_polynomial_coefficients_decode_from_movs(table, name):
    blk = B.get_block(name, table)
    (prog,) = [PG.entry(p, table) for p in blk.programs]
    movs = [_words(ln)[0] for ln in blk.lines if ln.startswith("mov.b32 r")]
    assert all(w >> 16 == w & 0xFFFF for w in movs)
    halves = [w & 0xFFFF for w in movs]
    want = _bits(prog["coeffs_bits"])
    if prog["form"] in ("odd", "residual_odd", "residual_even"):
        want = want[1:]                            # c0 = 0 is never materialised
    # Horner consumes c_D first: each coefficient appears once, in descending order
    found = [h for h in halves if h in want]
    assert found == list(reversed(want)) or sorted(found) == sorted(want)
    for h in want:
        assert h in halves


@pytest.mark.parametrize("table", tables())
def test_every_block_matches_fused_replay_on_all_patterns(table):
    """Emulator(generated PTX) == fit.runtime.replay(..., "fused") on all 65,536 patterns
    in both lanes, for every bf16 and f16 block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in B.MAIN_BLOCKS:
            try:
                blk = B.get_block(name, table)
            except KeyError:
                continue                      # the table lacks this program
            got = em.run_block(blk, *R.block_inputs(blk, R.block_dtype(blk, table)))
            exp, valid = R.expected_words(blk, table)
            for j, (g, e) in enumerate(zip(got, exp)):
                bad = np.flatnonzero((g != e) & valid)
                assert bad.size == 0, (name, j, bad[:5], g[bad[:5]], e[bad[:5]])


def test_block_text_is_self_contained():
    blk = B.get_block("sigmoid_fwd_bwd", json.load(open(FIXTURE)))
    text = blk.asm_text()
    assert text.startswith("{") and text.endswith("}")
    assert text.count(";") == blk.n_instructions + 1    # + the .reg declaration
    assert "$0" in text and "$1" in text and "$3" in text


def test_sigmoid_attn_f16_head_then_tail_is_the_block():
    """The FP16 program's overlapped-step pair: head + tail = sigmoid_attn_fwd_f16x2 op for op
    and bit for bit on all patterns (masked q -> +0 P, as the BF16 pair)."""
    table = PG.load_table()
    full = B.get_block("sigmoid_attn_fwd_f16x2", table)
    head = B.get_block("sigmoid_attn_fwd_f16x2_head", table)
    tail = B.get_block("sigmoid_attn_fwd_f16x2_tail", table)
    assert tail.lines == ("mul.rn.f16x2 $0, $1, $1",) and head.n_instructions + 1 == full.n_instructions
    ins = R.block_inputs(full, "f16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (p,) = em.run_block(full, *ins)
        (q,) = em.run_block(head, *ins)
        (pq,) = em.run_block(tail, q)
        (p0,) = em.run_block(tail, q & np.uint32(0xFFFF))
    assert np.array_equal(pq, p) and np.array_equal(p0, p & np.uint32(0xFFFF))
