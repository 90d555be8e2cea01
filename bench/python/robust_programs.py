"""robust.py's program generator: seeded op programs (pointwise chains with transcendental
ops, norms, softmax, last-dim reductions, matmuls, views, in-place ops, casts) as specs,
and the code that builds one on a device. Split from robust.py; see its docstring."""

from __future__ import annotations

import math
import random

KIB = 1024
MIB = 1024 * 1024

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
