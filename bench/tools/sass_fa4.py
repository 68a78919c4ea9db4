"""Our sm_90a softmax kernels beside flash-attn-4's, read from SASS on the CPU (no GPU).

    python bench/tools/sass_fa4.py --json bench/results/sass_fa4.json   # and sass_fa4.md beside it

For each shape class (head dim, causal, MHA / GQA) both forward and both backward kernels are
compiled for sm_90a without a GPU (ours: tests/builds.py, the plan attention() resolves at B 4,
S 4096, H_q 32 (16 at D = 256); FA4 4.0.0b36: flash_attn_func / flash_attn.cute.interface.
_flash_attn_bwd on fake tensors, in a child process, as tests/fa4_builds.py does for its builds),
then the hot loop is located (the shortest loop holding HGMMA and at least 8 MUFU: the forward's
mask-free key-block step, the backward's query-block step) and its opcodes counted, with the whole
kernel's epilogue stores.  Per unit of work: the loop's instructions issued by the MMA warps (4 per
consumer warpgroup) per (query row x key row) of its tile, x 1000.  This is a static count: it
says what each kernel issues per tile, not how the tensor pipe overlaps it (ncu on the H200 does:
bench/tools/ncu_fwd.py, ncu_bwd.py).

The second table is a host model of the CTA order (wave_model): how many query heads' rows the
first 132 CTAs (one wave, one CTA per SM) stream at once, in our order (kernels/tile_scheduler:
LPT with heads fastest in head_loop builds; the kv_sections knob: L2-sized sections of KV heads)
and in FA4's (blockIdx.x = key block fastest), so how many CTAs share each stream in L2.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests"), ROOT]

# (name, D, causal, H_q, H_kv) at B = 4, S = 4096
SHAPES = [("d128-causal-gqa", 128, True, 32, 8), ("d128-causal-mha", 128, True, 32, 32),
          ("d128-full-mha", 128, False, 32, 32), ("d128-full-gqa", 128, False, 32, 8),
          ("d64-causal-gqa", 64, True, 32, 8), ("d256-causal-gqa", 256, True, 16, 8)]
B, S = 4, 4096
COUNTED = ("HGMMA", "MUFU", "BAR", "SYNCS", "WARPGROUP", "STS", "LDS", "STSM", "FFMA", "FMUL", "FADD", "FSEL",
           "F2FP", "FMNMX", "ISETP", "UBLKRED")
EPILOGUE = {"STG.32": r"STG\.E", "STG.128": r"STG\.E\.128", "UBLKCP (bulk copy)": r"UBLKCP.*",
            "UTMASTG (TMA store)": r"UTMASTG.*", "RED.F32": r"REDG?\.E\.ADD\.F32.*"}
CACHE = os.path.join(os.environ.get("TMPDIR", "/tmp"), "fap_sass_fa4")


# ------------------------------------------------------------------ SASS loops
_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"\s*(\.L_x_\d+):")


def parse(text: str) -> list:
    """[(address, instruction text)] with the labels resolved: {label: address} in .labels."""
    ins, pend, labels = [], [], {}
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            pend.append(m.group(1))
            continue
        m = _LINE.match(line)
        if not m or m.group(2).startswith("."):
            continue
        a = int(m.group(1), 16)
        for lab in pend:
            labels[lab] = a
        pend = []
        ins.append((a, m.group(2).strip()))
    return ins, labels


def opcode(t: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", t).split()[0]


def hot_loop(text: str) -> dict:
    """Opcode family counts of the shortest loop that holds HGMMA and at least 8 MUFU (the score
    step; shorter loops are the producer's or the dQ writer's, longer ones enclose it)."""
    ins, labels = parse(text)
    best = None
    for a, t in ins:
        if opcode(t).startswith("BRA"):
            m = re.search(r"(\.L_x_\d+)", t)
            if not m or labels.get(m.group(1), a + 1) >= a:
                continue
            lo = labels[m.group(1)]
            c = Counter(opcode(x).split(".")[0] for y, x in ins if lo <= y <= a)
            c["total"] = sum(1 for y, _ in ins if lo <= y <= a)
            if c["HGMMA"] and c["MUFU"] >= 8 and (best is None or c["total"] < best["total"]):
                best = c
    return {k: best.get(k, 0) for k in ("total",) + COUNTED}


def epilogue(text: str) -> dict:
    from flash_attn_poly.kernels import sass
    return sass.count_opcodes(text, EPILOGUE)


# ------------------------------------------------------------------ builds
def ours(direction, d, causal, hq, hkv) -> tuple:
    """(SASS, (tile_m, tile_n), consumer warps) of our build of the plan at the shape."""
    import builds
    p = builds.plan("softmax", "native", d=d, causal=causal, shape=(B, S, hq, hkv))
    if direction == "fwd":
        return builds.fwd(p.fwd).sass, (p.fwd.tile_m, p.fwd.tile_n), 4 * p.fwd.tile_m // 64
    return builds.bwd(p.bwd).sass, (p.bwd.tile_m, p.bwd.tile_n), 8


def fa4(direction, d, causal, hq, hkv) -> tuple:
    """(SASS, (tile_m, tile_n), consumer warps) of FA4's build at the shape (cached)."""
    out = os.path.join(CACHE, f"fa4_{direction}_d{d}_c{int(causal)}_h{hq}_{hkv}.sass")
    if not os.path.exists(out):
        os.makedirs(CACHE, exist_ok=True)
        dump = os.path.join(CACHE, "dump")
        os.makedirs(dump, exist_ok=True)
        env = dict(os.environ, FLASH_ATTENTION_ARCH="sm_90", CUTE_DSL_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132",
                   CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=dump)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--fa4-child", direction, str(d),
                            str(int(causal)), str(hq), str(hkv), out], env=env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"FA4 {direction} build D={d} causal={causal} failed:\n{r.stderr[-3000:]}")
    with open(out) as f:
        text = f.read()
    m = re.match(r"// tile (\d+) x (\d+)", text)
    tm, tn = int(m.group(1)), int(m.group(2))
    return text, (tm, tn), (4 * tm // 64 if direction == "fwd" else 8)


def _fa4_child(direction, d, causal, hq, hkv, out):
    import fa4_builds
    fa4_builds.import_fa4_on_cpu()
    import torch
    from flash_attn.cute.interface import (_flash_attn_bwd, _tile_size_bwd_sm90, _tile_size_fwd_sm90,
                                           flash_attn_func)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from flash_attn_poly.kernels import sass
    dump = os.environ["CUTE_DSL_DUMP_DIR"]
    for h in glob.glob(os.path.join(dump, "*.cubin")):
        os.remove(h)
    with FakeTensorMode():
        q = torch.empty(B, S, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(B, S, hkv, d, device="cuda", dtype=torch.bfloat16)
        if direction == "fwd":
            flash_attn_func(q, k, torch.empty_like(k), causal=causal)
        else:
            o, lse = torch.empty_like(q), torch.empty(B, hq, S, device="cuda", dtype=torch.float32)
            _flash_attn_bwd(q, k, torch.empty_like(k), o, torch.empty_like(o), lse, d ** -0.5, causal, 0.0)
    hits = glob.glob(os.path.join(dump, f"*flash_{direction}_sm90*.cubin"))
    if len(hits) != 1:
        raise RuntimeError(f"expected one FA4 sm90 {direction} cubin, found {hits}")
    with open(hits[0], "rb") as f:
        cubin = f.read()
    if direction == "fwd":
        cfg = _tile_size_fwd_sm90(d, d, causal, False)
    else:
        cfg = _tile_size_bwd_sm90(d, d, causal, False)
    head = f"// tile {cfg.m_block_size} x {cfg.n_block_size}\n"
    with open(out, "w") as f:
        f.write(head + sass.disassemble(cubin))


# ------------------------------------------------------------------ CTA order model
def wave_model(d, causal, hq, hkv, kv_sections=False, sms=132) -> dict:
    """Query-side streams of the first `sms` CTAs (one wave, one CTA per SM).  A stream is one
    query head's Q, dO (16-bit) and FP32 dQ accumulator rows, read (and added to) block by block
    by every CTA of the wave that works on that head; CTAs on the same stream in step share its
    lines in L2.  Ours (head_loop): a CTA per (key block, KV head) walks its group's query heads
    in turn, so the CTAs of one KV head share one stream at a time; the LPT order puts heads
    fastest (causal: key block 0 is the longest, so ascending blocks), kv_sections cuts it into
    L2-sized sections of KV heads.  FA4: a CTA per (key block, query head), key block fastest.
    traffic_GB: the whole backward's query-side bytes if each stream is fetched once per wave
    that shares it (non-causal count; causal about half)."""
    from flash_attn_poly.kernels.tile_scheduler import heads_per_section, lpt_tile
    n_blocks = -(-S // 128)
    g = hq // hkv
    per_head = S * d * (2 + 2 + 4)
    # both grids put the batch in blockIdx.z: the first wave is batch 0's (n_blocks x heads >= 132 here)
    group = heads_per_section(hkv, S * g, d * 8) if kv_sections else hkv
    ours = len({lpt_tile(i, n_blocks, hkv, group, False)[1] for i in range(min(sms, n_blocks * hkv))})
    fa4 = len({i // n_blocks for i in range(min(sms, n_blocks * hq))})
    reads = n_blocks * hq * B * per_head   # every key block's CTA reads every query row of its heads
    return {"ours_streams": ours, "ours_ctas_per_stream": sms / ours,
            "ours_traffic_GB": reads / (sms / ours) / 1e9,
            "fa4_streams": fa4, "fa4_ctas_per_stream": sms / fa4, "fa4_traffic_GB": reads / (sms / fa4) / 1e9}


def main(md_path: str, json_path: str) -> dict:
    rows = []
    for direction in ("fwd", "bwd"):
        for name, d, causal, hq, hkv in SHAPES:
            row = {"direction": direction, "shape": name, "D": d, "causal": causal, "hq": hq, "hkv": hkv}
            for who, build in (("ours", ours), ("fa4", fa4)):
                text, tile, warps = build(direction, d, causal, hq, hkv)
                loop = hot_loop(text)
                row[who] = {"tile": list(tile), "loop": loop, "epilogue": epilogue(text),
                            "per_pair_x1000": round(loop["total"] * warps / (tile[0] * tile[1]) * 1000, 1)}
            if direction == "bwd":
                row["model"] = wave_model(d, causal, hq, hkv)
                row["model_kv_sections"] = wave_model(d, causal, hq, hkv, kv_sections=True)
            rows.append(row)
            print(direction, name, row["ours"]["per_pair_x1000"], row["fa4"]["per_pair_x1000"], flush=True)
    from importlib import metadata
    sys.path.insert(0, os.path.dirname(HERE))   # bench/ (protocol: the commit a result was measured at)
    import protocol
    out = {"what": "sm_90a softmax forward and backward SASS, ours vs FA4, CPU compile (no GPU)",
           "flash_attn_4": metadata.version("flash-attn-4"), "cutlass_dsl": metadata.version("nvidia-cutlass-dsl"),
           "commit": protocol.commit_id(), "batch": B, "seqlen": S, "rows": rows}
    with open(json_path, "w") as f:
        json.dump(out, f, indent=1)
    with open(md_path, "w") as f:
        f.write(render(out))
    return out


def _loop_table(rows: list) -> list:
    L = ["| shape | who | tile (q x k) | loop instr | per pair x1000 | HGMMA | MUFU | BAR | SYNCS | STS | LDS | "
         "STSM | FFMA+FMUL+FADD+FSEL | FMNMX | ISETP | epilogue stores |", "|" + "---|" * 16]
    for r in rows:
        for who in ("ours", "fa4"):
            x, lp = r[who], r[who]["loop"]
            ep = ", ".join(f"{k} {v}" for k, v in x["epilogue"].items() if v)
            fp = lp["FFMA"] + lp["FMUL"] + lp["FADD"] + lp["FSEL"]
            L.append(f"| {r['shape']} | {who} | {x['tile'][0]} x {x['tile'][1]} | {lp['total']} | "
                     f"{x['per_pair_x1000']} | {lp['HGMMA']} | {lp['MUFU']} | {lp['BAR']} | {lp['SYNCS']} | "
                     f"{lp['STS']} | {lp['LDS']} | {lp['STSM']} | {fp} | {lp['FMNMX']} | {lp['ISETP']} | {ep} |")
    return L


def render(out: dict) -> str:
    fwd = [r for r in out["rows"] if r["direction"] == "fwd"]
    bwd = [r for r in out["rows"] if r["direction"] == "bwd"]
    L = ["# SASS: ours vs FA4 (sm_90a, softmax, CPU compile)", "",
         f"Commit {out['commit']}, flash-attn-4 {out['flash_attn_4']}, nvidia-cutlass-dsl {out['cutlass_dsl']}; "
         f"B = {out['batch']}, S = {out['seqlen']} (heads as named; D = 256: 16 query heads), BF16. Written by "
         "`python bench/tools/sass_fa4.py --json bench/results/sass_fa4.json` (its docstring: method). Static counts: what a loop step issues, not "
         "how it overlaps on the H200. Per pair x1000: loop instructions x consumer warps (4 per MMA warpgroup) / "
         "(query rows x key rows of the step) x 1000.", "",
         "## Forward: the key-block step (per thread)", "",
         "The mask-free step of each kernel (ours: the persistent grid's; the O rescale sits in a branch that the "
         "stale row max mostly skips, FA4's too where its counts show it).", ""]
    L += _loop_table(fwd)
    L += ["", "## Backward: the query-block step (per thread)", "",
          "A causal loop includes the diagonal tiles' mask (ours: a branch of ~100 instructions, "
          "kernels/attn_bwd_sm90.mask_causal, skipped off the diagonal), so the non-causal rows compare the steps "
          "like for like. D = 256: our CTA computes one 128-column chunk of dQ / dK / dV and recomputes S and dP "
          "over the full D; FA4's 64 x 48 tile computes all 256 columns.", ""]
    L += _loop_table(bwd)
    L += ["", "## Backward: query-side streams of one wave (host model, 132 CTAs)", "",
          "A stream: one query head's Q, dO and FP32 dQ accumulator rows, which every CTA of the wave on that "
          "head reads block by block (wave_model's docstring). CTAs per stream = the L2 sharing of those rows; "
          "GB: the whole backward's query-side bytes if each stream is fetched once per wave.", "",
          "| shape | ours streams | CTAs / stream | GB | kv_sections streams | CTAs / stream | GB | FA4 streams | "
          "CTAs / stream | GB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in bwd:
        m, k = r["model"], r["model_kv_sections"]
        L.append(f"| {r['shape']} | {m['ours_streams']} | {m['ours_ctas_per_stream']:.1f} | "
                 f"{m['ours_traffic_GB']:.2f} | {k['ours_streams']} | {k['ours_ctas_per_stream']:.1f} | "
                 f"{k['ours_traffic_GB']:.2f} | {m['fa4_streams']} | {m['fa4_ctas_per_stream']:.1f} | "
                 f"{m['fa4_traffic_GB']:.2f} |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--fa4-child":
        direction, d, c, hq, hkv, out = sys.argv[2:8]
        _fa4_child(direction, int(d), c == "1", int(hq), int(hkv), out)
        raise SystemExit(0)
    sys.path.insert(0, os.path.dirname(HERE))   # bench/ (protocol)
    import protocol
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_json_arg(ap, "sass_fa4")
    path = protocol.output_path(ap.parse_args().json, "sass_fa4")
    main(os.path.splitext(path)[0] + ".md", path)
