"""Soak (issue 26 item 4): adaptive training and decoding for a set time, with shapes that
change every N steps, sampled over time.

    python bench/python/soak.py [--minutes 30] [--interval 10] [--shape-every 50]
                                [--csv soak.csv] [--plot soak.png] [--json soak.json]

Each step is one AdamW step of an MLP (batch size cycling through BATCHES every
--shape-every steps) and one decoding step of a small attention model whose context grows
to MAX_CONTEXT and starts again. Every --interval seconds (at the next start of the step cycle) a sample records steps, process
RSS, device memory (allocated, reserved), kernel-cache entries, the key table's size
(segments the recorder knows), tier-2 compiles, programs and fused segments; each sample
also checks the model against CPU (its parameters copied to a CPU twin: outputs must be
bit-equal). The summary gives growth after warm-up (the first --warmup share of the run)
per 10 minutes, for RSS and the key table (the target: <= 1%), and compiles in the second
half (no compile storm: the shapes recur, so keys and kernels stop growing).
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time

BATCHES = (16, 24, 32, 48)
MAX_CONTEXT = 48


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cache_entries(folder):
    n = 0
    for _, _, files in os.walk(folder):
        n += sum(1 for f in files if f.endswith(".so"))
    return n


def build(torch, device):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                              torch.nn.Linear(256, 64)).to(device)
    attn = torch.nn.MultiheadAttention(64, 4, batch_first=True).to(device)
    return mlp, attn


def run(args):
    import torch

    import neuron_eager

    assert neuron_eager.get_mode() == "adaptive"
    mlp, attn = build(torch, "neuron")
    cpu_mlp, cpu_attn = build(torch, "cpu")
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    data = {b: (torch.randn(b, 64, generator=g).to("neuron"), torch.randn(b, 64, generator=g).to("neuron"))
            for b in BATCHES}
    probe = torch.randn(8, 64, generator=g)
    tokens = torch.randn(2, MAX_CONTEXT, 64, generator=g).to("neuron")
    samples, steps, context = [], 0, 1
    # Samples are taken only at the start of the step cycle (batch sizes x context lengths
    # x loss reads), so the sample's own syncs and probe cut the op stream at the same
    # place every time: the keys they make recur instead of growing with the clock.
    cycle = math.lcm(20, args.shape_every * len(BATCHES), MAX_CONTEXT)
    start = time.perf_counter()
    deadline = start + args.minutes * 60
    next_sample = start
    mismatches = 0
    while True:
        now = time.perf_counter() if steps % cycle == 0 else 0.0
        if now >= next_sample or now >= deadline:
            torch.neuron.synchronize()
            # The CPU twin: the same parameters, the same probe, bit-equal outputs.
            with torch.no_grad():
                cpu_mlp.load_state_dict({k: v.cpu() for k, v in mlp.state_dict().items()})
                equal = torch.equal(mlp(probe.to("neuron")).cpu(), cpu_mlp(probe))
            mismatches += not equal
            c = neuron_eager.counters()
            stats = torch.neuron.memory_stats()
            samples.append({
                "t_s": round(now - start, 2), "steps": steps, "rss_mb": rss_bytes() / 2**20,
                "allocated_mb": torch.neuron.memory_allocated() / 2**20,
                "reserved_mb": stats["reserved_bytes.all.current"] / 2**20,
                "cache_entries": cache_entries(os.environ["NEURON_CACHE_DIR"]),
                "keys": neuron_eager._C.segment_cache_stats()["segments"],
                "compiles": c["native_compiles"], "programs": c["programs"],
                "segments_fused": c["segments_fused"], "equal": equal})
            s = samples[-1]
            print(f"{s['t_s']:8.1f} s  steps {steps:7d}  RSS {s['rss_mb']:7.1f} MiB  device "
                  f"{s['allocated_mb']:6.1f}/{s['reserved_mb']:6.1f} MiB  cache {s['cache_entries']:4d}  "
                  f"keys {s['keys']:5d}  compiles {s['compiles']:4d}  programs {s['programs']:4d}"
                  + ("" if equal else "  MISMATCH"), flush=True)
            if now >= deadline:
                break
            while next_sample <= now:
                next_sample += args.interval
        batch = BATCHES[(steps // args.shape_every) % len(BATCHES)]
        x, y = data[batch]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(mlp(x), y)
        loss.backward()
        opt.step()
        with torch.no_grad():
            ctx = tokens[:, :context]
            attn(ctx[:, -1:], ctx, ctx, need_weights=False)
        context = context % MAX_CONTEXT + 1
        steps += 1
        if steps % 20 == 0:
            loss.item()  # a host read, as a training loop logging its loss makes
    return samples, mismatches


def growth_per_10min(samples, key, warm_from):
    after = [s for s in samples if s["t_s"] >= warm_from]
    if len(after) < 2 or after[0][key] <= 0:
        return None
    minutes = (after[-1]["t_s"] - after[0]["t_s"]) / 60
    if minutes <= 0:
        return None
    return (after[-1][key] - after[0][key]) / after[0][key] * 100 / (minutes / 10)


def summarize(samples, mismatches, args):
    total = samples[-1]["t_s"]
    warm_from = total * args.warmup
    half = [s for s in samples if s["t_s"] >= total / 2]
    out = {"minutes": args.minutes, "samples": len(samples), "steps": samples[-1]["steps"],
           "mismatches": mismatches, "warmup_s": warm_from,
           "rss_growth_pct_per_10min": growth_per_10min(samples, "rss_mb", warm_from),
           "keys_growth_pct_per_10min": growth_per_10min(samples, "keys", warm_from),
           "compiles_second_half": samples[-1]["compiles"] - half[0]["compiles"] if half else None,
           "final": samples[-1]}

    def pct(v):
        return "n/a" if v is None else f"{v:+.2f}%"

    print(f"soak: {out['steps']} steps in {total:.0f} s; after warm-up ({warm_from:.0f} s): RSS "
          f"{pct(out['rss_growth_pct_per_10min'])} per 10 min, key table "
          f"{pct(out['keys_growth_pct_per_10min'])} per 10 min (target <= 1%); compiles in the "
          f"second half: {out['compiles_second_half']}; CPU-twin mismatches: {mismatches}")
    return out


def plot(samples, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(2, 2, figsize=(10, 6), sharex=True)
    for ax, (key, label) in zip(axes.flat, [("rss_mb", "RSS (MiB)"), ("reserved_mb", "device reserved (MiB)"),
                                            ("keys", "key table (segments)"), ("compiles", "tier-2 compiles")]):
        ax.plot(t, [s[key] for s in samples])
        ax.set_title(label)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--shape-every", type=int, default=50, help="steps between batch-size changes")
    ap.add_argument("--warmup", type=float, default=0.3, help="share of the run counted as warm-up")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not args.minutes > 0 or not args.interval > 0 or args.shape_every < 1 or not 0 <= args.warmup < 1:
        ap.error("--minutes and --interval must be > 0, --shape-every >= 1, --warmup in [0, 1)")
    if os.environ.get("NEURON_EAGER_MODE") != "adaptive":
        # The mode is read at start-up: run again with it set (and a fresh cache unless given).
        env = {**os.environ, "NEURON_EAGER_MODE": "adaptive"}
        env.setdefault("NEURON_CACHE_DIR", tempfile.mkdtemp(prefix="neuron-soak-cache-"))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    samples, mismatches = run(args)
    out = summarize(samples, mismatches, args)
    out["series"] = samples
    if args.csv:
        with open(args.csv, "w") as f:
            keys = list(samples[0])
            f.write(",".join(keys) + "\n")
            for s in samples:
                f.write(",".join(str(s[k]) for k in keys) + "\n")
    if args.plot:
        plot(samples, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
