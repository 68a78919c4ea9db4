"""Short training sanity check: a tiny causal decoder trained with each attention mode x
evaluator (and the poly vs torch SwiGLU MLP), same seed, same data order for every arm.

Model: 4 layers, d_model 512, 8 query heads / 2 KV heads (GQA), head_dim 64, learned
positions, RMSNorm (pre-norm), SwiGLU MLP (hidden 1408), untied output head, vocab 512,
seq 512, batch 8; FP32 master params, BF16 autocast on CUDA; AdamW lr 1e-3, warm-up 20.
Data: a fixed first-order Markov chain over the vocab (seeded transition matrix with
peaked rows); its entropy rate is printed as the loss floor (log(512) = 6.24 is chance).

Arms (--arms): softmax_native, softcap_native, softcap_poly, sigmoid_native,
sigmoid_poly (MLP: torch F.silu(g)*u), swiglu_poly (softmax/native attention + the
PolySwiGLU kernel; its pair is softmax_native).  softcap uses --softcap (default 5.0,
not Gemma-2's 50: with 50 the cap never bites on a model this small, so softcap would
be softmax in disguise); sigmoid uses the default bias -ln(S).

    python bench/tools/train_sanity.py       # H200, all arms: bench/out/train_sanity.json (+ .md)
    python bench/tools/train_sanity.py --json bench/results/train_sanity.json   # commit a run
    python bench/tools/train_sanity.py --from-json X.json --md Y.md   # re-render the table
    python bench/tools/train_sanity.py --tiny   # CPU smoke: reference backend, 2 steps

Reported per arm: loss every 10 steps (raw and EMA-smoothed, alpha 0.1), final smoothed
loss, ms/step (median after 3 warm-up steps: the first steps compile the kernels), and
per poly arm the max |smoothed poly - smoothed native| over all steps.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
# The repository root goes LAST: first on sys.path it would shadow an installed (or, on the
# device machine, laid-out) flash_attn_poly whose kernels/ and asm/ live inside the package.
sys.path.append(os.path.dirname(os.path.dirname(HERE)))
import protocol  # noqa: E402
from flash_attn_poly import PolySwiGLU, attention  # noqa: E402

ARMS = ("softmax_native", "softcap_native", "softcap_poly", "sigmoid_native", "sigmoid_poly",
        "swiglu_poly")
PAIRS = {"softcap_poly": "softcap_native", "sigmoid_poly": "sigmoid_native",
         "swiglu_poly": "softmax_native"}
EMA = 0.1


def arm_config(arm: str):
    """(attention mode, attention evaluator, mlp) of an arm."""
    if arm == "swiglu_poly":
        return "softmax", "native", "poly"
    mode, ev = arm.split("_")
    return mode, ev, "torch"


# ---- data ---------------------------------------------------------------------------------

def markov_chain(vocab: int, seed: int, sharpness: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(vocab, vocab, generator=g) * sharpness, dim=-1)
    pi = torch.full((vocab,), 1.0 / vocab)
    for _ in range(200):                       # stationary distribution
        pi = pi @ probs
    ent = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    return probs, float((pi * ent).sum())


def make_batches(probs, steps, batch, seq, seed):
    """All token batches up front: (steps, batch, seq + 1) int64, deterministic."""
    g = torch.Generator().manual_seed(seed + 1)
    n = steps * batch
    toks = torch.empty(n, seq + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, probs.shape[0], (n,), generator=g)
    for t in range(seq):
        toks[:, t + 1] = torch.multinomial(probs[toks[:, t]], 1, generator=g).squeeze(1)
    return toks.view(steps, batch, seq + 1)


# ---- model --------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


class Block(nn.Module):
    def __init__(self, d, hq, hkv, hd, hidden, mode, evaluator, mlp, softcap, backend):
        super().__init__()
        self.hq, self.hkv, self.hd = hq, hkv, hd
        self.mode, self.evaluator, self.backend = mode, evaluator, backend
        self.softcap = softcap if mode == "softcap" else None
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, (hq + 2 * hkv) * hd, bias=False)
        self.o = nn.Linear(hq * hd, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.act = PolySwiGLU("poly") if mlp == "poly" else None

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([self.hq * self.hd, self.hkv * self.hd,
                                              self.hkv * self.hd], -1)
        q = q.reshape(b, s, self.hq, self.hd)
        k = k.reshape(b, s, self.hkv, self.hd)
        v = v.reshape(b, s, self.hkv, self.hd)
        if self.backend == "cuda":             # kernels want BF16, contiguous per head
            q, k, v = (t.to(torch.bfloat16).contiguous() for t in (q, k, v))
        a = attention(q, k, v, self.mode, causal=True, softcap=self.softcap,
                      evaluator=self.evaluator, backend=self.backend)
        x = x + self.o(a.reshape(b, s, -1).to(x.dtype) if not torch.is_autocast_enabled()
                       else a.reshape(b, s, -1))
        h = self.n2(x)
        g, u = self.gate(h), self.up(h)
        m = self.act(g.contiguous(), u.contiguous()) if self.act is not None else F.silu(g) * u
        return x + self.down(m)


class TinyLM(nn.Module):
    def __init__(self, vocab, seq, d, layers, hq, hkv, hd, hidden, mode, evaluator, mlp,
                 softcap, backend):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, hq, hkv, hd, hidden, mode, evaluator, mlp,
                                          softcap, backend) for _ in range(layers))
        self.norm, self.head = RMSNorm(d), nn.Linear(d, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


# ---- training -----------------------------------------------------------------------------

def train_arm(arm, batches, cfg, device, log=print):
    mode, ev, mlp = arm_config(arm)
    torch.manual_seed(cfg["seed"])            # identical init for every arm
    model = TinyLM(cfg["vocab"], cfg["seq"], cfg["d_model"], cfg["layers"], cfg["hq"],
                   cfg["hkv"], cfg["head_dim"], cfg["hidden"], mode, ev, mlp,
                   cfg["softcap"], cfg["backend"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95),
                            weight_decay=0.1)
    steps = batches.shape[0]
    warm = max(1, min(20, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / steps))))
    use_amp = device.type == "cuda"
    losses, times, ema = [], [], None
    for i in range(steps):
        t0 = time.perf_counter()
        tok = batches[i].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            logits = model(tok[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        lv = loss.item()                      # syncs: the step time below is complete
        times.append(time.perf_counter() - t0)
        if not math.isfinite(lv):
            log(f"  {arm}: non-finite loss at step {i}; stopping this arm")
            losses.append(lv)
            break
        losses.append(lv)
        ema = lv if ema is None else (1 - EMA) * ema + EMA * lv
        if i % 10 == 0 or i == steps - 1:
            log(f"  {arm:15s} step {i:4d} loss {lv:.4f} ema {ema:.4f} ({times[-1] * 1e3:.1f} ms)")
    return losses, times


def smooth(xs):
    out, e = [], None
    for x in xs:
        e = x if e is None else (1 - EMA) * e + EMA * x
        out.append(e)
    return out


def summarize(arm, losses, times):
    sm = smooth(losses)
    steady = times[3:] if len(times) > 3 else times
    idx = [i for i in range(len(losses)) if i % 10 == 0 or i == len(losses) - 1]
    return {"arm": arm, "mode": arm_config(arm)[0], "evaluator": arm_config(arm)[1],
            "mlp": arm_config(arm)[2], "steps": len(losses),
            "curve": [{"step": i, "loss": losses[i], "ema": sm[i]} for i in idx],
            "ema_all": sm, "final_ema": sm[-1] if sm else float("nan"),
            "ms_per_step": 1e3 * statistics.median(steady) if steady else float("nan"),
            "first_step_s": times[0] if times else float("nan")}


def add_gaps(results):
    by = {r["arm"]: r for r in results}
    for arm, ref in PAIRS.items():
        if arm in by and ref in by and "ema_all" in by[arm] and "ema_all" in by[ref]:  # failed arms have none
            a, b = by[arm]["ema_all"], by[ref]["ema_all"]
            n = min(len(a), len(b))
            by[arm]["vs"] = ref
            by[arm]["max_abs_gap"] = max(abs(a[i] - b[i]) for i in range(n)) if n else float("nan")
            by[arm]["final_gap"] = a[n - 1] - b[n - 1] if n else float("nan")


def markdown(out) -> str:
    c = out["config"]
    lines = [f"# Training sanity check ({out.get('device', '?')}, {out.get('date', '?')}, "
             f"commit {out.get('commit', '?')})", "",
             f"Tiny causal decoder: {c['layers']} layers, d_model {c['d_model']}, "
             f"{c['hq']}/{c['hkv']} heads (GQA), head_dim {c['head_dim']}, MLP hidden {c['hidden']}, "
             f"vocab {c['vocab']}, seq {c['seq']}, batch {c['batch']}, {c['steps']} steps AdamW "
             f"lr {c['lr']}, seed {c['seed']}, backend {c['backend']}"
             f"{', BF16 autocast' if c['backend'] == 'cuda' else ', FP32'}. softcap = {c['softcap']} "
             f"(tight on purpose: Gemma-2's 50 would never bite at this scale). Data: seeded "
             f"Markov chain, entropy-rate floor {out['entropy_floor']:.3f} nats, "
             f"chance ln({c['vocab']}) = {math.log(c['vocab']):.3f}. EMA alpha {EMA}.", "",
             "| arm | attention | evaluator | MLP | final EMA loss | vs | max abs EMA gap | final gap | ms/step | first step s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["results"]:
        if "error" in r:
            lines.append(f"| {r['arm']} | error: {r['error'][:80]} |||||||||")
            continue
        gap = f"{r['max_abs_gap']:.4f}" if "max_abs_gap" in r else ""
        fg = f"{r['final_gap']:+.4f}" if "final_gap" in r else ""
        lines.append(f"| {r['arm']} | {r['mode']} | {r['evaluator']} | {r['mlp']} | "
                     f"{r['final_ema']:.4f} | {r.get('vs', '')} | {gap} | {fg} | "
                     f"{r['ms_per_step']:.1f} | {r['first_step_s']:.1f} |")
    ok = [r for r in out["results"] if "error" not in r]
    if ok:
        steps = [p["step"] for p in ok[0]["curve"]]
        lines += ["", "Loss curve (EMA) every 10 steps:", "",
                  "| step | " + " | ".join(r["arm"] for r in ok) + " |",
                  "|---" * (len(ok) + 1) + "|"]
        for j, s in enumerate(steps):
            row = [f"{r['curve'][j]['ema']:.3f}" if j < len(r["curve"]) else "" for r in ok]
            lines.append(f"| {s} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _meta():
    import datetime
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"device": dev, "date": datetime.date.today().isoformat(), "commit": protocol.commit_id()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--softcap", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--backend", choices=("cuda", "reference"), default=None,
                   help="default: cuda when available, else reference")
    p.add_argument("--tiny", action="store_true", help="2 steps, small sizes (CPU smoke)")
    protocol.add_json_arg(p, "train_sanity")
    p.add_argument("--md", help="write the Markdown table here instead of beside the JSON")
    p.add_argument("--from-json", help="only render the Markdown (to --md, and stdout) from an earlier JSON")
    a = p.parse_args(argv)
    if a.from_json:
        with open(a.from_json) as f:
            out = json.load(f)
        text = markdown(out)
        if a.md:
            with open(a.md, "w") as f:
                f.write(text)
        print(text)
        return 0
    backend = a.backend or ("cuda" if torch.cuda.is_available() else "reference")
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    cfg = dict(vocab=512, seq=a.seq, d_model=512, layers=4, hq=8, hkv=2, head_dim=64,
               hidden=1408, batch=a.batch, steps=a.steps, lr=a.lr, seed=a.seed,
               softcap=a.softcap, backend=backend)
    if a.tiny:
        cfg.update(vocab=64, seq=32, d_model=64, layers=1, hq=4, hkv=2, head_dim=64,
                   hidden=128, batch=2, steps=2)
    arms = [s for s in a.arms.split(",") if s]
    for arm in arms:
        if arm not in ARMS:
            p.error(f"unknown arm {arm!r}; choose from {ARMS}")
    probs, floor = markov_chain(cfg["vocab"], cfg["seed"])
    batches = make_batches(probs, cfg["steps"], cfg["batch"], cfg["seq"], cfg["seed"])
    print(f"train_sanity: backend {backend}, arms {arms}, {cfg['steps']} steps, "
          f"entropy floor {floor:.3f} nats, chance {math.log(cfg['vocab']):.3f}", flush=True)
    results = []
    t_all = time.perf_counter()
    for arm in arms:
        if arm_config(arm)[2] == "poly" and device.type != "cuda":
            print(f"  {arm}: skipped (PolySwiGLU needs CUDA)")
            continue
        t0 = time.perf_counter()
        try:
            losses, times = train_arm(arm, batches, cfg, device,
                                      log=lambda s: print(s, flush=True))
            results.append(summarize(arm, losses, times))
        except Exception as e:  # noqa: BLE001 - one broken arm must not hide the others
            import traceback
            traceback.print_exc()
            results.append({"arm": arm, "error": f"{type(e).__name__}: {e}"})
        print(f"  {arm}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    add_gaps(results)
    out = {**_meta(), "config": cfg, "entropy_floor": floor, "arms": arms, "results": results,
           "total_s": time.perf_counter() - t_all}
    text = markdown(out)
    print(text)
    path = protocol.output_path(a.json, "train_sanity")
    protocol.write_json(path, out)
    md = a.md or os.path.splitext(path)[0] + ".md"
    with open(md, "w") as f:
        f.write(text)
    protocol.progress(f"wrote {path} and {md}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
