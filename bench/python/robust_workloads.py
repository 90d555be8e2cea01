"""robust.py's small workloads: MLP, CNN and transformer training steps and greedy
decoding of a tiny transformer, each at a tiny, full and preamble size. Split from
robust.py; see its docstring."""

from __future__ import annotations

import math

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
