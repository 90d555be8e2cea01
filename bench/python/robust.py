"""Robustness benchmark: adaptive mode against eager on seeded programs nobody tuned for.

A seeded generator writes op programs (pointwise chains with transcendental ops, layer
norm and a written-out RMSNorm, (log_)softmax, last-dim sum/mean/amax and ops on their
results, matmuls in between, transposes, reshapes, slices, in-place ops, broadcasting
along rows and columns, bf16 stretches between fp32 ones, batch sizes that change every
step or every few steps); beside them run four small workloads written here: MLP
training (AdamW), a CNN training step (conv, batch norm, SGD with momentum), a small
transformer training step and greedy decoding of a tiny transformer with a growing KV
cache. A cell is one program (or workload), one tensor size (all of the program's
tensors have it; a workload's is its largest activation) and one host-read interval
(`.item()` or `.cpu()` of a small reduction every 1, 10, 100 or 500 iterations).

Every cell runs in four fresh processes, one after the other: CPU eager (plain PyTorch,
neuron not loaded), neuron eager, neuron adaptive with an empty kernel cache
(NEURON_CACHE_DIR a new folder; the process waits for its background compiles before it
exits) and adaptive again in a second process sharing that cache (warm). Each process
first runs the cell's own code twice at a size no cell uses (8 rows; a workload's
preamble configuration), so lazy imports and library set-up, seconds that a fresh process
pays on its first ops whatever the mode, stay out of the curves; then it runs the cell's
iterations from the same seeded inputs and stamps the clock at every host read.

From the stamps, the warm-up curve: ms per iteration over iterations 0-50 ("first"),
50-300 ("early") and the steady state, the median of the blocks of max(50, reads)
iterations after iteration 300, the first such block dropped. Window ends round up to
the next read (with reads every 500: 0-500, no early window, 3 blocks of 500). Cells of
8 MiB and more use a short plan to bound their run time: windows 20 and 60, 3 blocks of
20 (32 MiB and more, and --tiny: 10 and 30, blocks of 10). Per cell it prints
adaptive/eager and adaptive/CPU (steady CPU or eager time over adaptive's: > 1 means
adaptive is faster), cold and warm, the curves, and whether every result (outputs,
persistent state, every host-read value) equals CPU eager's bit for bit (compared as
integers of their width, so -0.0 against 0.0 or a NaN payload counts as a difference;
both neuron configs must match). At the end: the worst cell, the median over all cells
and over cells whose tensors exceed 1 MiB, the cells below 0.95, the warm-up check (a
cell fails it when adaptive's first or early window, cold or warm, averages more than
1.5x its own steady state or more than eager's same window), and every bit mismatch with
its seed and cell. A cell during which other work kept more than 0.3 cores busy
(from /proc/stat) is marked noisy, and a cell whose neuron processes found different
builds of the package (someone reinstalled it meanwhile) says so.

    python bench/python/robust.py                        # 29 programs + 8 workload cells
    python bench/python/robust.py --seed 3 --cells 15 --workloads none
    python bench/python/robust.py --sizes 2M,8M --reads 1,10 --json out.json
    python bench/python/robust.py --seed 1 --only 4,17   # rerun single cells
    python bench/python/robust.py --list                 # the cells and their programs
    python bench/python/robust.py --tiny                 # CI: 3 small cells, ~1.5 min

The default (sizes 16K,256K,2M,8M,64M; reads 1,10,100,500; workloads with reads 1 and
10) takes about 35 minutes on this 2-core VM (148 processes). Sizes take K/M suffixes
(KiB, MiB), multiples of 16K from 16K to 256M; reads 1 to 1000. Programs at 8M and more
run with reads up to 10 and at 32M and more with a read every iteration (longer
intervals would take minutes per process there); `--sizes`/`--reads` combinations
outside that rule are skipped. `--cells N` runs the first N program cells (they cycle
through the allowed size and read combinations); workloads take reads up to 10.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import write_json  # noqa: E402

KIB = 1024
MIB = 1024 * 1024
DEFAULT_SIZES = "16K,256K,2M,8M,64M"
DEFAULT_READS = "1,10,100,500"
DEFAULT_CELLS = 29
WORKLOADS = ("mlp", "cnn", "transformer", "decode")
CONFIGS = ("cpu", "eager", "cold", "warm")
SLOW_RATIO = 0.95
WARMUP_SLACK = 1.5
NOISY_CORES = 0.3  # other work keeping more cores busy than this marks a cell noisy

# --- the program generator --------------------------------------------------------------

POINTWISE = ["exp", "tanh", "sigmoid", "gelu", "silu", "log1abs", "rsqrt", "pow", "affine",
             "residual", "rowbcast", "colbcast"]
ROWWISE = ["layer_norm", "rmsnorm", "softmax", "log_softmax", "reduce"]
VIEWS = ["transpose_pw", "colmajor", "reshape_softmax", "slice_cat"]
INPLACE = ["iadd", "imul", "slice_imul", "iadd_col"]
CASTS = ["to_bf16", "to_fp32"]
ALL_KINDS = POINTWISE + ROWWISE + ["matmul"] + VIEWS + INPLACE + CASTS
FLAVORS = {  # relative weights of the op families
    "pointwise": {"pw": 8, "row": 1, "mm": 0, "view": 1, "inplace": 1, "cast": 1},
    "norm": {"pw": 4, "row": 4, "mm": 1, "view": 1, "inplace": 1, "cast": 1},
    "mixed": {"pw": 4, "row": 2, "mm": 1, "view": 2, "inplace": 2, "cast": 1},
    "all": None,  # every op kind once, in a random order
}
FAMILY = {"pw": POINTWISE, "row": ROWWISE, "mm": ["matmul"], "view": VIEWS, "inplace": INPLACE,
          "cast": CASTS}
TO_FP32 = {"residual", "rowbcast", "colbcast", "to_fp32"}  # type promotion with fp32 operands


def parse_size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": KIB, "M": MIB, "G": 1024 * MIB}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMG" else t
    if not num.isdigit():
        raise ValueError(f"size {text!r} is not digits with an optional K/M suffix")
    return int(num) * mult


def fmt_size(n: int) -> str:
    return f"{n // MIB}M" if n >= MIB and n % MIB == 0 else f"{n // KIB}K"


def read_limit(size: int) -> int:
    """The longest read interval a program of this tensor size runs with (run time)."""
    return 1 if size >= 32 * MIB else 10 if size >= 8 * MIB else 1000


def max_ops(size: int) -> int:
    return 5 if size >= 32 * MIB else 8 if size >= 8 * MIB else 10 if size >= MIB else 14


def gen_op(kind: str, rng: random.Random) -> dict:
    o = {"op": kind}
    if kind == "exp":
        o["a"] = rng.choice([0.5, 1.0, 2.0])
    elif kind == "gelu":
        o["approx"] = rng.choice(["none", "tanh"])
    elif kind == "rsqrt":
        o["eps"] = rng.choice([0.1, 0.5, 1.0])
    elif kind == "pow":
        o["p"] = rng.choice([2, 3, 0.5])
    elif kind in ("affine", "imul", "slice_imul", "slice_cat"):
        o["a"] = round(rng.uniform(-1.5, 1.5), 3) or 0.5
        o["b"] = round(rng.uniform(-0.5, 0.5), 3)
    elif kind in ("residual", "iadd"):
        o["src"] = rng.choice(["x", "r"])
    elif kind == "softmax":
        o["a"] = rng.choice([1.0, 0.5, 2.0])
    elif kind == "reduce":
        o["red"] = rng.choice(["sum", "mean", "amax"])
        o["then"] = rng.choice(["sub", "div", "mulsig"])
    elif kind == "transpose_pw":
        o["fn"] = rng.choice(["sigmoid", "tanh", "scale"])
    return o


def gen_program(seed: int, index: int, size: int, flavor: str | None = None,
                shapes: str | None = None) -> dict:
    """A program spec (plain JSON): its shape, shape schedule, ops and host-read kind."""
    rng = random.Random(seed * 1_000_003 + index)
    n = size // 4  # fp32 elements
    cols = rng.choice([c for c in (64, 128, 256, 512, 1024, 2048, 4096)
                       if n % c == 0 and n // c >= 16 and (n // c) * 16 >= c])
    rows = n // cols
    # "all" (every kind, ~30 ops) only where an op is cheap
    flavor = flavor or rng.choice(["pointwise", "norm", "mixed", "mixed"]
                                  + (["all"] if size < MIB else []))
    if shapes is None:
        shapes = rng.choices(["static", "every_step", "every_k"], [6, 2, 2])[0]
    every = 1 if shapes == "every_step" else rng.choice([3, 5, 10]) if shapes == "every_k" else 0
    weights = FLAVORS[flavor]
    if weights is None:
        kinds = list(ALL_KINDS)
        rng.shuffle(kinds)
    else:
        fams = list(weights)
        kinds = [rng.choice(FAMILY[rng.choices(fams, [weights[f] for f in fams])[0]])
                 for _ in range(rng.randint(min(6, max_ops(size)), max_ops(size)))]
    ops, dtype, owned = [], "fp32", False
    for kind in kinds:
        if kind in INPLACE and not owned:
            continue  # y is still an input: an in-place op would change the input
        if kind == "to_bf16" and dtype == "bf16" or kind == "to_fp32" and dtype == "fp32":
            continue  # a cast to the same dtype returns y itself
        ops.append(gen_op(kind, rng))
        owned = True
        if kind == "to_bf16":
            dtype = "bf16"
        elif kind in TO_FP32:
            dtype = "fp32"
    return {"kind": "program", "flavor": flavor, "rows": rows, "cols": cols,
            "shapes": shapes, "every": every, "span": max(2, min(rows // 2, 48)),
            "k": rng.choice([32, 64]), "feedback": rng.random() < 0.4,
            "read": rng.choice(["item_sum", "item_amax", "cpu_rows"]), "ops": ops,
            "input_seed": seed * 1000 + index}


# --- cells and iteration plans ------------------------------------------------------------


def plan_for(size: int, reads: int, tiny: bool) -> dict:
    """Window ends (w1, w2), steady block length and count; iterations = w2 + blocks."""
    if tiny or size >= 32 * MIB:
        w1, w2, block, nblocks = 10, 30, 10, 3
    elif size >= 8 * MIB:
        w1, w2, block, nblocks = 20, 60, 20, 3
    else:
        w1, w2, block, nblocks = 50, 300, 50, 4
    up = lambda v: -(-v // reads) * reads  # noqa: E731  (the first read at or after v)
    w1, w2, block = up(w1), up(w2), up(block)
    if reads >= 500 and not tiny:
        nblocks = 3
    return {"w1": w1, "w2": w2, "block": block, "iters": w2 + nblocks * block}


def build_cells(args) -> list[dict]:
    cells = []
    if args.tiny:
        combos = [(16 * KIB, 1, "all", "every_k"), (256 * KIB, 10, "mixed", "static")]
        for i, (size, reads, flavor, shapes) in enumerate(combos[:args.cells]):
            cells.append({"program": gen_program(args.seed, i, size, flavor, shapes),
                          "size": size, "reads": reads})
    else:
        combos = [(s, r) for s in args.sizes for r in args.reads if r <= read_limit(s)]
        # Round-robin over combos, cheapest sizes first, so a small --cells still covers
        # every size and read interval; the biggest size gets one cell per pass at most.
        for i in range(args.cells):
            size, reads = combos[i % len(combos)]
            cells.append({"program": gen_program(args.seed, i, size), "size": size,
                          "reads": reads})
    wl_reads = [1] if args.tiny else [r for r in args.reads if r <= 10]
    for name in args.workloads:
        for reads in wl_reads:
            cells.append({"workload": name, "size": workload_bytes(name, args.tiny),
                          "reads": reads})
    for i, c in enumerate(cells):
        c["index"] = i
        c["plan"] = plan_for(c["size"], c["reads"], args.tiny)
        c["name"] = cell_name(c)
    return cells


def cell_name(c: dict) -> str:
    if "workload" in c:
        return f"{c['workload']} r{c['reads']}"
    p = c["program"]
    shape = "" if p["shapes"] == "static" else f" rows/{p['every']}"
    return (f"{p['flavor']} {fmt_size(c['size'])} {p['rows']}x{p['cols']}{shape} "
            f"{len(p['ops'])}ops r{c['reads']}")


# --- the child: one cell under one config -------------------------------------------------


def make_program(spec: dict, device: str):
    import torch
    import torch.nn.functional as F

    rows, cols, K = spec["rows"], spec["cols"], spec["k"]
    g = torch.Generator().manual_seed(spec["input_seed"])
    cpu = {
        "x": torch.randn(rows, cols, generator=g),
        "r": torch.randn(rows, cols, generator=g),
        "w": torch.rand(cols, generator=g) + 0.5,
        "c": torch.randn(rows, 1, generator=g) * 0.5,
        "lnw": torch.rand(cols, generator=g) + 0.5,
        "lnb": torch.randn(cols, generator=g) * 0.1,
        "g": torch.rand(cols, generator=g) + 0.5,
        "Wk": torch.randn(K, K, generator=g) / math.sqrt(K),
    }
    T = {k: v.to(device) for k, v in cpu.items()}
    for k in ("lnw", "lnb", "g", "Wk"):  # dtype-matched copies for bf16 stretches
        T[k + "_bf16"] = cpu[k].to(torch.bfloat16).to(device)
    s = torch.zeros(rows, cols).to(device)
    sfx = {torch.float32: "", torch.bfloat16: "_bf16"}
    ops = spec["ops"]
    span, every = spec["span"], spec["every"]

    def rows_at(i):
        if not every:
            return rows
        return rows - ((i // every) * 37) % span

    def apply(o, y, t):
        k = o["op"]
        d = sfx[y.dtype]
        if k == "exp":
            return torch.exp(torch.tanh(y) * o["a"])
        if k == "tanh":
            return torch.tanh(y)
        if k == "sigmoid":
            return torch.sigmoid(y)
        if k == "gelu":
            return F.gelu(y, approximate=o["approx"])
        if k == "silu":
            return F.silu(y)
        if k == "log1abs":
            return torch.log(y.abs() + 1)
        if k == "rsqrt":
            return torch.rsqrt(y.abs() + o["eps"])
        if k == "pow":
            return (y.abs() + 1).pow(0.5) if o["p"] == 0.5 else torch.tanh(y).pow(o["p"])
        if k == "affine":
            return y * o["a"] + o["b"]
        if k == "residual":
            return y + t[o["src"]]
        if k == "rowbcast":
            return y * t["w"]
        if k == "colbcast":
            return y + t["c"]
        if k == "layer_norm":
            return F.layer_norm(y, (cols,), T["lnw" + d], T["lnb" + d], 1e-5)
        if k == "rmsnorm":
            return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * T["g" + d]
        if k == "softmax":
            return F.softmax(y * o["a"], -1)
        if k == "log_softmax":
            return F.log_softmax(y, -1)
        if k == "reduce":
            m = getattr(y, o["red"])(-1, keepdim=True)
            if o["then"] == "sub":
                return y - m
            if o["then"] == "div":
                return y / (m.abs() + 1)
            return y * torch.sigmoid(m)
        if k == "matmul":
            return (y.reshape(-1, K) @ T["Wk" + d]).reshape(y.shape)
        if k == "transpose_pw":
            yt = y.t()
            z = torch.sigmoid(yt) if o["fn"] == "sigmoid" else torch.tanh(yt) \
                if o["fn"] == "tanh" else yt * 0.75
            return z.t()
        if k == "colmajor":
            return y.t().contiguous().t()  # a column-major tensor for the ops after it
        if k == "reshape_softmax":
            return F.softmax(y.reshape(-1, cols // 2), -1).reshape(y.shape)
        if k == "slice_cat":
            h = cols // 2
            return torch.cat([y[:, h:], y[:, :h] * o["a"]], dim=1)
        if k == "iadd":
            return y.add_(t[o["src"]])
        if k == "imul":
            return y.mul_(o["a"])
        if k == "slice_imul":
            y[:, : cols // 2].mul_(o["a"])
            return y
        if k == "iadd_col":
            return y.add_(t["c"])
        if k == "to_bf16":
            return y.to(torch.bfloat16)
        if k == "to_fp32":
            return y.float()
        raise ValueError(f"unknown op {k!r}")

    out = {"reads": []}

    def step(i):
        n = rows_at(i)
        t = {"x": T["x"][:n], "r": T["r"][:n], "c": T["c"][:n], "w": T["w"]}
        st = s[:n]
        y = t["x"] + st * 0.25 if spec["feedback"] else t["x"]
        for o in ops:
            y = apply(o, y, t)
        st.mul_(0.5).add_(y, alpha=0.5)
        out["y"] = y

    def read():
        y = out["y"]
        if spec["read"] == "item_sum":
            out["reads"].append(s.sum().item())
        elif spec["read"] == "item_amax":
            out["reads"].append(y.amax().item())
        else:
            out["reads"].append(y.float().mean(-1)[:8].cpu())

    def result():
        reads = out["reads"]
        packed = torch.stack(reads) if reads and isinstance(reads[0], torch.Tensor) \
            else torch.tensor(reads, dtype=torch.float64)
        return {"y": out["y"].cpu(), "s": s.cpu(), "reads": packed}

    return step, read, result


# --- the workloads ------------------------------------------------------------------------


WL_SIZES = {  # (tiny, full, preamble) settings; the preamble's shapes are neither's
    "mlp": ({"batch": 16, "width": 64}, {"batch": 64, "width": 256},
            {"batch": 8, "width": 32}),
    "cnn": ({"batch": 4, "hw": 8, "ch": 8}, {"batch": 8, "hw": 16, "ch": 16},
            {"batch": 2, "hw": 6, "ch": 4}),
    "transformer": ({"batch": 2, "seq": 16, "d": 32, "heads": 2, "layers": 1, "vocab": 64},
                    {"batch": 4, "seq": 32, "d": 128, "heads": 4, "layers": 2, "vocab": 256},
                    {"batch": 1, "seq": 8, "d": 16, "heads": 2, "layers": 1, "vocab": 32}),
    "decode": ({"prompt": 4, "new": 12, "d": 32, "heads": 2, "layers": 1, "vocab": 64},
               {"prompt": 8, "new": 48, "d": 128, "heads": 4, "layers": 2, "vocab": 256},
               {"prompt": 3, "new": 4, "d": 16, "heads": 2, "layers": 1, "vocab": 32}),
}
PREAMBLE = 2  # iterations of the cell's code at the preamble size (below hot_threshold)


def workload_bytes(name: str, tiny: bool) -> int:
    """Bytes of the workload's largest activation tensor (its cell's size)."""
    c = WL_SIZES[name][0 if tiny else 1]
    if name == "mlp":
        return c["batch"] * c["width"] * 4
    if name == "cnn":
        return c["batch"] * 2 * c["ch"] * c["hw"] * c["hw"] * 4
    if name == "transformer":
        return max(c["batch"] * c["seq"] * 4 * c["d"], c["batch"] * c["heads"] * c["seq"] ** 2) * 4
    return (c["prompt"] + c["new"]) * c["vocab"] * 4


def tiny_lm(c):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, cache=None):
            b, t, d = x.shape
            h = self.heads
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            if cache is not None:
                if "k" in cache:  # decoding: the KV cache grows by t every call
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
            if t > 1:
                n = k.shape[2]
                mask = torch.ones(t, n, dtype=torch.bool, device=x.device).tril(n - t)
                att = att.masked_fill(~mask, float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(c["vocab"], c["d"])
            self.pos = nn.Embedding(256, c["d"])
            self.blocks = nn.ModuleList(Block(c["d"], c["heads"]) for _ in range(c["layers"]))
            self.ln = nn.LayerNorm(c["d"])
            self.head = nn.Linear(c["d"], c["vocab"])

        def forward(self, ids, caches=None, start=0):
            pos = torch.arange(start, start + ids.shape[1], device=ids.device)
            x = self.emb(ids) + self.pos(pos)
            for i, blk in enumerate(self.blocks):
                x = blk(x, None if caches is None else caches[i])
            return self.head(self.ln(x))

    return LM()


def make_workload(name: str, variant: int, device: str):
    """variant: 0 tiny, 1 full, 2 the preamble's size."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    c = WL_SIZES[name][variant]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    out = {"reads": []}
    if name == "decode":
        model = tiny_lm(c).eval().to(device)
        prompt = torch.randint(0, c["vocab"], (1, c["prompt"]), generator=g).to(device)
        state = {}

        def step(i):
            with torch.no_grad():
                j = i % c["new"]
                if j == 0:  # a new sequence: prefill the prompt
                    state["caches"] = [{} for _ in model.blocks]
                    logits = model(prompt, state["caches"], 0)
                else:
                    logits = model(state["tok"], state["caches"], c["prompt"] + j - 1)
                state["tok"] = logits[:, -1:].argmax(-1)
                state["logits"] = logits[:, -1]

        def read():
            out["reads"].append(state["tok"].cpu())

        def result():
            return {"reads": torch.cat(out["reads"]), "logits": state["logits"].cpu()}

        return step, read, result

    if name == "mlp":
        w = c["width"]
        model = nn.Sequential(nn.Linear(w, w), nn.GELU(), nn.Linear(w, w), nn.GELU(),
                              nn.Linear(w, 10)).to(device)
        x = torch.randn(c["batch"], w, generator=g).to(device)
        y = torch.randint(0, 10, (c["batch"],), generator=g).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = lambda: F.cross_entropy(model(x), y)  # noqa: E731
    elif name == "cnn":
        ch, hw = c["ch"], c["hw"]
        model = nn.Sequential(
            nn.Conv2d(3, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.ReLU(),
            nn.Conv2d(ch, 2 * ch, 3, padding=1), nn.ReLU(),
            nn.Conv2d(2 * ch, 2 * ch, 3, stride=2, padding=1), nn.SiLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * ch, 10)).to(device)
        x = torch.randn(c["batch"], 3, hw, hw, generator=g).to(device)
        y = torch.randint(0, 10, (c["batch"],), generator=g).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-4)
        loss_fn = lambda: F.cross_entropy(model(x), y)  # noqa: E731
    else:
        model = tiny_lm(c).to(device)
        ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), generator=g).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = lambda: F.cross_entropy(  # noqa: E731
            model(ids[:, :-1]).reshape(-1, c["vocab"]), ids[:, 1:].reshape(-1))

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        out["loss"] = loss.detach()

    def read():
        out["reads"].append(out["loss"].item())

    def result():
        named = list(model.named_parameters())
        res = {n: p.detach().cpu() for n, p in named[:: max(1, len(named) // 6)]}
        res.update({"b:" + n: b.cpu() for n, b in model.named_buffers()})
        res["reads"] = torch.tensor(out["reads"], dtype=torch.float64)
        return res

    return step, read, result


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(cfg_path: str) -> None:
    with open(cfg_path) as f:
        cfg = json.load(f)
    import torch

    device = "cpu" if cfg["config"] == "cpu" else "neuron"
    cell, plan = cfg["cell"], cfg["cell"]["plan"]

    def make(small):
        if "workload" in cell:
            return make_workload(cell["workload"], 2 if small else 0 if cfg["tiny"] else 1,
                                 device)
        spec = cell["program"]
        if small:  # 8 rows: no row count of the cell itself (those exceed rows/2 >= 8)
            spec = dict(spec, rows=8, every=0, input_seed=spec["input_seed"] + 7)
        return make_program(spec, device)

    # Preamble: the cell's own code at a small size, twice. A fresh process pays lazy
    # imports (Python meta kernels on neuron) and library set-up (oneDNN, MKL) on its
    # first ops, seconds in all; that is not adaptive mode's warm-up, which is keyed by
    # shapes the preamble never uses.
    pre_step, pre_read, _ = make(True)
    for i in range(PREAMBLE):
        pre_step(i)
    pre_read()
    step, read, result = make(False)
    if device != "cpu":
        import neuron_eager
        assert neuron_eager.get_mode() == cfg["mode"], (neuron_eager.get_mode(), cfg["mode"])
        torch.neuron.synchronize()
        neuron_eager.reset_counters()
    reads = cell["reads"]
    marks = [(0, time.perf_counter())]
    for i in range(plan["iters"]):
        step(i)
        if (i + 1) % reads == 0:
            read()  # a host read waits for the queued work
            marks.append((i + 1, time.perf_counter()))
    fig = {"marks": [(n, t - marks[0][1]) for n, t in marks], "peak_rss": peak_rss_bytes()}
    if device != "cpu":
        import neuron_eager
        so = neuron_eager._C.__file__  # which build ran: others may reinstall meanwhile
        fig["build"] = f"{os.path.getmtime(so):.0f}:{os.path.getsize(so)}"
        fig["counters"] = neuron_eager.counters()
        fig["max_memory_allocated"] = torch.neuron.max_memory_allocated()
        if cfg["mode"] == "adaptive":
            # The cold process leaves a complete cache for the warm one (not timed).
            neuron_eager._C.native_wait_idle()
    torch.save(result(), cfg["result_path"])
    with open(cfg["fig_path"], "w") as f:
        json.dump(fig, f)


# --- the parent: figures from the marks ---------------------------------------------------


def curve(marks: list, plan: dict) -> dict:
    """ms per iteration over the warm-up windows and the steady blocks."""
    at = dict(marks)

    def per_iter(a, b):
        return (at[b] - at[a]) / (b - a) * 1e3

    w1, w2, block, iters = plan["w1"], plan["w2"], plan["block"], plan["iters"]
    blocks = [per_iter(a, a + block) for a in range(w2, iters, block)]
    later = blocks[1:] if len(blocks) >= 3 else blocks
    return {"first_ms": per_iter(0, w1), "early_ms": per_iter(w1, w2) if w2 > w1 else None,
            "steady_ms": statistics.median(later), "blocks_ms": blocks}


def bits_equal(a, b) -> tuple[bool, str]:
    """Bit-for-bit equality of two results (dicts of CPU tensors)."""
    import torch

    if set(a) != set(b):
        return False, f"keys differ: {sorted(set(a) ^ set(b))}"
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False, f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
        if x.is_floating_point():
            xi = x.contiguous().view(ints[x.element_size()])
            yi = y.contiguous().view(ints[y.element_size()])
        else:
            xi, yi = x, y
        if not torch.equal(xi, yi):
            diff = (xi != yi).sum().item()
            detail = f"{k}: {diff} of {x.numel()} elements differ"
            if x.is_floating_point():
                detail += (f" (max abs diff {(x.double() - y.double()).abs().nan_to_num(0).max().item():.3g},"
                           f" torch.equal {torch.equal(x, y)})")
            return False, detail
    return True, ""


def busy_seconds() -> float:
    """CPU seconds every core has spent busy so far (all processes on the machine)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_measured(cmd, env, timeout):
    """subprocess.run, plus the cores that other work on the machine kept busy meanwhile
    (all busy time less this child's own CPU time, over its wall time)."""
    busy0, kids0, t0 = busy_seconds(), children_seconds(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    others = (busy_seconds() - busy0 - (children_seconds() - kids0)) / max(wall, 1e-9)
    return proc, wall, max(0.0, others)


def run_child(cell: dict, config: str, work: str, cache_dir: str, tiny: bool,
              timeout: float) -> dict:
    tag = f"cell{cell['index']}_{config}"
    cfg = {"cell": cell, "config": config, "tiny": tiny,
           "mode": "eager" if config in ("cpu", "eager") else "adaptive",
           "result_path": os.path.join(work, tag + ".pt"),
           "fig_path": os.path.join(work, tag + ".json")}
    cfg_path = os.path.join(work, tag + ".cfg.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    env = dict(os.environ)
    if config == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # plain PyTorch
    else:
        env["NEURON_EAGER_MODE"] = cfg["mode"]
        env["NEURON_CACHE_DIR"] = cache_dir
    try:
        proc, wall, others = run_measured(
            [sys.executable, os.path.abspath(__file__), "--child", cfg_path], env, timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-1500:].strip()}
    with open(cfg["fig_path"]) as f:
        fig = json.load(f)
    fig.update(ok=True, wall_s=wall, other_cores_busy=others, result_path=cfg["result_path"])
    fig.update(curve(fig["marks"], cell["plan"]))
    return fig


def run_cell(cell: dict, work: str, args) -> dict:
    import torch

    cache_dir = os.path.join(work, f"cache{cell['index']}")
    os.makedirs(cache_dir)
    runs = {c: run_child(cell, c, work, cache_dir, args.tiny, args.timeout) for c in CONFIGS}
    row = {k: v for k, v in cell.items()}
    row["runs"] = runs
    if not all(r["ok"] for r in runs.values()):
        row["error"] = "; ".join(f"{c}: {r['error']}" for c, r in runs.items() if not r["ok"])
        return row
    ref = torch.load(runs["cpu"]["result_path"])
    row["bits"] = {}
    for c in CONFIGS[1:]:
        ok, detail = bits_equal(ref, torch.load(runs[c]["result_path"]))
        row["bits"][c] = {"equal": ok, "detail": detail}
    row["bit_equal"] = all(b["equal"] for b in row["bits"].values())
    for c in CONFIGS:
        os.remove(runs[c].pop("result_path"))
    cpu, eager = runs["cpu"]["steady_ms"], runs["eager"]["steady_ms"]
    row["adaptive_vs_eager"] = eager / runs["cold"]["steady_ms"]
    row["adaptive_vs_cpu"] = cpu / runs["cold"]["steady_ms"]
    row["warm_vs_eager"] = eager / runs["warm"]["steady_ms"]
    row["warm_vs_cpu"] = cpu / runs["warm"]["steady_ms"]
    row["eager_vs_cpu"] = cpu / eager
    row["warmup_violations"] = warmup_violations(runs)
    row["other_cores_busy"] = max(r["other_cores_busy"] for r in runs.values())
    row["builds"] = sorted({r["build"] for c, r in runs.items() if c != "cpu"})
    row["noisy"] = row["other_cores_busy"] > NOISY_CORES
    shutil.rmtree(cache_dir, ignore_errors=True)
    return row


def warmup_violations(runs: dict) -> list[str]:
    """Adaptive's first and early windows against its own steady state (x1.5) and against
    eager's same window."""
    out = []
    for c in ("cold", "warm"):
        r = runs[c]
        for w in ("first_ms", "early_ms"):
            v, e = r[w], runs["eager"][w]
            if v is None:
                continue
            if v > WARMUP_SLACK * r["steady_ms"]:
                out.append(f"{c} {w[:-3]} {v:.3g} ms > {WARMUP_SLACK}x steady {r['steady_ms']:.3g}")
            if v > e:
                out.append(f"{c} {w[:-3]} {v:.3g} ms > eager's {e:.3g}")
    return out


def fmt_curve(r: dict) -> str:
    early = "-" if r["early_ms"] is None else f"{r['early_ms']:.3g}"
    return f"{r['first_ms']:.3g}/{early}/{r['steady_ms']:.3g}"


def print_row(row: dict, total: int) -> None:
    head = f"cell {row['index']} of {total}: {row['name']}"
    if "error" in row:
        print(f"{head}: ERROR {row['error'][:600]}", flush=True)
        return
    r = row["runs"]
    bits = "bits ok" if row["bit_equal"] else "BIT MISMATCH " + "; ".join(
        f"{c}: {b['detail']}" for c, b in row["bits"].items() if not b["equal"])
    print(f"{head}\n    ms/iter cpu {r['cpu']['steady_ms']:.3g} eager {r['eager']['steady_ms']:.3g} "
          f"adaptive {r['cold']['steady_ms']:.3g} (warm {r['warm']['steady_ms']:.3g})  "
          f"adaptive/eager {row['adaptive_vs_eager']:.2f}x (warm {row['warm_vs_eager']:.2f}x)  "
          f"adaptive/CPU {row['adaptive_vs_cpu']:.2f}x (warm {row['warm_vs_cpu']:.2f}x)\n"
          f"    warm-up first/early/steady ms: eager {fmt_curve(r['eager'])}  "
          f"cold {fmt_curve(r['cold'])}  warm {fmt_curve(r['warm'])}  "
          f"{'ok' if not row['warmup_violations'] else 'SLOW START'}  {bits}"
          + (f"\n    [noisy: other work kept {row['other_cores_busy']:.1f} cores busy]"
             if row["noisy"] else "")
          + ("\n    [the package was reinstalled between this cell's processes]"
             if len(row["builds"]) > 1 else ""), flush=True)


def summarize(rows: list[dict], seed: int) -> dict:
    good = [r for r in rows if "error" not in r]
    s = {"cells": len(rows), "failed": [r["name"] for r in rows if "error" in r]}
    if good:
        worst = min(good, key=lambda r: r["adaptive_vs_eager"])
        big = [r["adaptive_vs_eager"] for r in good if r["size"] > MIB]
        quiet = [r["adaptive_vs_eager"] for r in good if not r["noisy"]]
        s.update(
            noisy=[r["index"] for r in good if r["noisy"]],
            median_adaptive_vs_eager_quiet=statistics.median(quiet) if quiet else None,
            worst={"cell": worst["index"], "name": worst["name"],
                   "adaptive_vs_eager": worst["adaptive_vs_eager"]},
            worst_warm=min(r["warm_vs_eager"] for r in good),
            median_adaptive_vs_eager=statistics.median(r["adaptive_vs_eager"] for r in good),
            median_adaptive_vs_eager_over_1mib=statistics.median(big) if big else None,
            median_adaptive_vs_cpu=statistics.median(r["adaptive_vs_cpu"] for r in good),
            below_095=[r["index"] for r in good if r["adaptive_vs_eager"] < SLOW_RATIO],
            warmup_violations={r["index"]: r["warmup_violations"] for r in good
                               if r["warmup_violations"]},
            bit_mismatches=[{"seed": seed, "cell": r["index"], "name": r["name"],
                             "configs": {c: b["detail"] for c, b in r["bits"].items()
                                         if not b["equal"]}}
                            for r in good if not r["bit_equal"]])
    return s


def print_summary(s: dict, seed: int) -> None:
    print(f"\n== robust.py seed {seed}: {s['cells']} cells "
          f"({len(s['failed'])} failed{': ' + ', '.join(s['failed']) if s['failed'] else ''})")
    if "worst" not in s:
        return
    w = s["worst"]
    big = s["median_adaptive_vs_eager_over_1mib"]
    print(f"worst cell (adaptive/eager, cold): {w['adaptive_vs_eager']:.2f}x  "
          f"cell {w['cell']} ({w['name']}); worst warm {s['worst_warm']:.2f}x")
    print(f"median adaptive/eager {s['median_adaptive_vs_eager']:.2f}x; over cells > 1 MiB "
          f"{'n/a' if big is None else f'{big:.2f}x'}; median adaptive/CPU "
          f"{s['median_adaptive_vs_cpu']:.2f}x")
    print(f"cells below {SLOW_RATIO}: {len(s['below_095'])} {s['below_095']}")
    if s["noisy"]:
        q = s["median_adaptive_vs_eager_quiet"]
        print(f"noisy cells (other work kept > {NOISY_CORES} cores busy during a process): "
              f"{len(s['noisy'])} {s['noisy']}; median adaptive/eager without them "
              f"{'n/a' if q is None else f'{q:.2f}x'}")
    print(f"warm-up check (first/early window > {WARMUP_SLACK}x own steady or > eager's): "
          f"{len(s['warmup_violations'])} cells" + ("" if not s["warmup_violations"] else ":"))
    for i, v in s["warmup_violations"].items():
        print(f"    cell {i}: " + "; ".join(v))
    if s["bit_mismatches"]:
        for m in s["bit_mismatches"]:
            print(f"BIT MISMATCH seed {m['seed']} cell {m['cell']} ({m['name']}): {m['configs']}")
    else:
        print("every result equals CPU eager bit for bit")


def parse_list(p, text: str, what: str, conv, lo, hi, lo_text, hi_text) -> list:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        try:
            v = conv(item)
        except ValueError as e:
            p.error(f"--{what}: {e}")
        if not lo <= v <= hi:
            p.error(f"--{what}: {item!r} is out of range ({lo_text} to {hi_text})")
        out.append(v)
    if not out:
        p.error(f"--{what}: empty list")
    return out


def main():
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="program generator seed (default 0)")
    p.add_argument("--cells", type=int, default=None,
                   help=f"generated program cells (default {DEFAULT_CELLS}, --tiny 2)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="tensor sizes, e.g. 16K,2M,64M")
    p.add_argument("--reads", default=DEFAULT_READS, help="host-read intervals, e.g. 1,100")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help="comma-separated subset of " + ",".join(WORKLOADS) + ", or none")
    p.add_argument("--only", default="", help="run only these cell indices (comma-separated)")
    p.add_argument("--tiny", action="store_true", help="CI smoke run: 3 small cells")
    p.add_argument("--list", action="store_true", help="print the cells and exit")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per child process")
    p.add_argument("--json", default=None, help="write every figure here")
    args = p.parse_args()
    if args.seed < 0:
        p.error("--seed must be >= 0")
    args.sizes = parse_list(p, args.sizes, "sizes", parse_size, 16 * KIB, 256 * MIB, "16K", "256M")
    bad = [fmt_size(s) for s in args.sizes if s % (16 * KIB)]
    if bad:
        p.error(f"--sizes: {', '.join(bad)} is not a multiple of 16K")
    args.reads = parse_list(p, args.reads, "reads", int, 1, 1000, "1", "1000")
    names = [] if args.workloads.strip() == "none" else \
        [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        p.error(f"--workloads: unknown {', '.join(unknown)} (allowed: {', '.join(WORKLOADS)}, none)")
    args.workloads = ["mlp"] if args.tiny and args.workloads == ",".join(WORKLOADS) else names
    if args.cells is None:
        args.cells = 2 if args.tiny else DEFAULT_CELLS
    if args.cells < 0:
        p.error("--cells must be >= 0")
    if not args.tiny and not any(r <= read_limit(s) for s in args.sizes for r in args.reads) \
            and args.cells:
        p.error("--sizes/--reads: no combination allowed (reads above 10 need sizes below "
                "8M, reads above 1 sizes below 32M)")
    cells = build_cells(args)
    if args.only:
        try:
            wanted = {int(i) for i in args.only.split(",") if i.strip()}
        except ValueError:
            p.error(f"--only: {args.only!r} is not a comma-separated list of cell indices")
        missing = sorted(wanted - {c["index"] for c in cells})
        if missing:
            p.error(f"--only: no cell {missing} (this run has cells 0 to {len(cells) - 1})")
        cells = [c for c in cells if c["index"] in wanted]
    if not cells:
        p.error("nothing to run (--cells 0 and --workloads none)")

    if args.list:
        for c in cells:
            p_ = c["plan"]
            print(f"cell {c['index']}: {c['name']}  iterations {p_['iters']} (windows "
                  f"{p_['w1']}, {p_['w2']}, blocks of {p_['block']})")
            if "program" in c:
                print("    " + " ".join(o["op"] for o in c["program"]["ops"]))
        return 0

    import torch

    threads = torch.get_num_threads()
    print(f"robust.py seed {args.seed}: {len(cells)} cells x {len(CONFIGS)} processes "
          f"({', '.join(CONFIGS)}), {threads} threads; ratios are steady ms/iter of the "
          f"other config over adaptive's (> 1: adaptive faster)", flush=True)
    # SIGTERM unwinds like Ctrl-C: the running child is killed, the work folder removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = tempfile.mkdtemp(prefix="robust_")
    rows = []
    t0 = time.perf_counter()
    try:
        for cell in cells:
            rows.append(run_cell(cell, work, args))
            print_row(rows[-1], len(cells))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s = summarize(rows, args.seed)
    s["wall_s"] = time.perf_counter() - t0
    print_summary(s, args.seed)
    print(f"({s['wall_s'] / 60:.1f} min)")
    write_json(args.json, {"seed": args.seed, "tiny": args.tiny, "threads": threads,
                           "sizes": args.sizes, "reads": args.reads, "summary": s,
                           "cells": rows})
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
