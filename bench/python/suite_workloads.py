"""The suite's workloads. Each one builds its state on a device and returns a `Run`:
`step()` does one unit of work, `result()` gives CPU tensors to check against CPU eager.

A workload knows nothing about timing or configs beyond `compiled` (None, or the
torch.compile backend to wrap the hot function with), so the same code runs under CPU
eager, `neuron` eager/adaptive and torch.compile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Run:
    step: Callable[[], object]
    result: Callable[[], Dict[str, torch.Tensor]]


@dataclass
class Workload:
    name: str
    title: str                      # what it is, with its size
    make: Callable[..., Run]        # make(device, compiled: backend name or None) -> Run
    kind: str                       # target group: chain, adamw, train, decode, shapes, warmup
    bytes_moved: int = 0            # compulsory traffic of one step (chains), for GB/s
    fixed_inner: Optional[int] = None   # steps per timed repeat (same shape sequence everywhere)
    exact: bool = False             # results must be equal (tokens), not just close
    needs_transformers: bool = False
    extra: Dict[str, object] = field(default_factory=dict)


def _maybe_compile(fn, compiled):
    return torch.compile(fn, backend=compiled) if compiled else fn


def _to_cpu(d):
    return {k: v.detach().to("cpu").clone() for k, v in d.items()}


# --- LayerNorm + GELU + residual chains -------------------------------------------------


def chain(rows, cols, blocks=3):
    def make(device, compiled):
        torch.manual_seed(0)
        x = torch.randn(rows, cols).to(device)
        ln = nn.LayerNorm(cols).to(device)

        def body(x):
            y = x
            for _ in range(blocks):
                y = y + F.gelu(ln(y))
            return y

        fn = _maybe_compile(body, compiled)
        out = {}

        def step():
            with torch.no_grad():
                out["y"] = fn(x)

        return Run(step, lambda: _to_cpu(out))

    # Compulsory traffic if each block is fused: read y once, write y once.
    return make, 2 * rows * cols * 4 * blocks


# --- AdamW step over ~100 parameters -----------------------------------------------------


def adamw(n_params, size):
    def make(device, compiled):
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(size).to(device)) for _ in range(n_params)]
        for p in params:
            p.grad = torch.randn(size).to(device)
        opt = torch.optim.AdamW(params, lr=1e-3)
        fn = _maybe_compile(opt.step, compiled)

        def result():
            return _to_cpu({f"p{i}": params[i] for i in range(0, n_params, max(1, n_params // 8))})

        return Run(fn, result)

    return make


# --- training steps ----------------------------------------------------------------------


def _train_run(model, batch_fn, device, compiled):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = {}

    def step():
        opt.zero_grad(set_to_none=True)
        loss = batch_fn()
        loss.backward()
        opt.step()
        return loss

    fn = _maybe_compile(step, compiled)

    def run():
        out["loss"] = fn().detach()

    def result():
        named = list(model.named_parameters())
        picked = {n: p for n, p in named[:: max(1, len(named) // 6)]}
        return _to_cpu({"loss": out["loss"], **picked})

    return Run(run, result)


def mlp_train(batch, width, depth=3, classes=10):
    def make(device, compiled):
        torch.manual_seed(0)
        layers = []
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.GELU()]
        model = nn.Sequential(*layers, nn.Linear(width, classes)).to(device)
        x = torch.randn(batch, width).to(device)
        y = torch.randint(0, classes, (batch,)).to(device)
        return _train_run(model, lambda: F.cross_entropy(model(x), y), device, compiled)

    return make


def llama_config(tiny):
    from transformers import LlamaConfig

    if tiny:
        return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1,
                           max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2)
    return LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688,
                       num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                       max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2)


def llama_train(tiny, batch, seq):
    def make(device, compiled):
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        config = llama_config(tiny)
        model = LlamaForCausalLM(config).to(device)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(3, config.vocab_size, (batch, seq), generator=g).to(device)
        return _train_run(model, lambda: model(input_ids=ids, labels=ids).loss, device, compiled)

    return make


def llama_decode(tiny, prompt, new_tokens):
    def make(device, compiled):
        from transformers import LlamaForCausalLM
        from transformers.generation.configuration_utils import CompileConfig

        torch.manual_seed(0)
        config = llama_config(tiny)
        model = LlamaForCausalLM(config).eval().to(device)
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(3, config.vocab_size, (1, prompt), generator=g).to(device)
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                      cache_implementation="static")
        if compiled:
            # transformers compiles the decode forward itself once given a config that
            # allows CPU; prefill stays eager, as it would for a user.
            cc = CompileConfig(backend=compiled, mode="default", dynamic=False)
            cc._compile_all_devices = True
            kwargs["compile_config"] = cc
        else:
            # transformers would auto-compile on a device named "neuron" with a dynamo
            # backend of that name (AWS Neuron's); we measure eager execution.
            kwargs["disable_compile"] = True
        out = {}

        def step():
            with torch.no_grad():
                out["tokens"] = model.generate(ids, **kwargs)

        return Run(step, lambda: _to_cpu(out))

    return make


# --- shapes that change every step -------------------------------------------------------


def shape_change(width, base_rows, span):
    """An MLP training step whose batch size is new at every call (novel shapes: the
    worst case for adaptive mode). The row count walks a permutation of `span` values, so
    no shape repeats within `span` steps, and every config sees the same sequence."""

    def make(device, compiled):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width),
                              nn.Linear(width, 10)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(3)
        xs = torch.randn(base_rows + span, width, generator=g).to(device)
        ys = torch.randint(0, 10, (base_rows + span,), generator=g).to(device)
        state = {"i": 0}
        out = {}

        def body(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        fn = _maybe_compile(body, compiled)

        def step():
            rows = base_rows + (state["i"] * 37) % span  # 37 is coprime with span
            state["i"] += 1
            out["loss"] = fn(xs[:rows], ys[:rows])

        def result():
            return _to_cpu({"loss": out["loss"], "w0": model[0].weight})

        return Run(step, result)

    return make


def all_workloads(tiny: bool) -> List[Workload]:
    if tiny:
        sizes = {"small": (8, 32), "cache": (16, 64), "dram": (32, 128)}
    else:
        sizes = {"small": (64, 256), "cache": (512, 1024), "dram": (8192, 4096)}
    out = []
    for label, (r, c) in sizes.items():
        make, moved = chain(r, c)
        out.append(Workload(f"chain_{label}", f"LN+GELU+residual x3, {r}x{c}", make, "chain",
                            bytes_moved=moved, extra={"size_class": label}))
    n, s = ((4, (8, 8)) if tiny else (100, (128, 128)))
    out.append(Workload("adamw", f"AdamW step, {n} x {s[0]}x{s[1]}", adamw(n, s), "adamw"))
    b, w = ((4, 16) if tiny else (64, 256))
    out.append(Workload("mlp_train", f"MLP train step, batch {b}, width {w}", mlp_train(b, w),
                        "train"))
    b, s = ((2, 8) if tiny else (4, 64))
    out.append(Workload("llama_train", f"small Llama train step, batch {b}x{s}",
                        llama_train(tiny, b, s), "train", needs_transformers=True))
    p, t = ((4, 8) if tiny else (8, 64))
    out.append(Workload("llama_decode", f"small Llama greedy decode {t} tokens, static cache",
                        llama_decode(tiny, p, t), "decode", exact=True,
                        needs_transformers=True))
    w, base, span = ((16, 4, 64) if tiny else (256, 32, 256))
    out.append(Workload("shape_change", f"MLP train step, batch changes every step ({base}..)",
                        shape_change(w, base, span), "shapes", fixed_inner=4))
    b, w = ((4, 24) if tiny else (128, 384))
    out.append(Workload("warmup", f"MLP train step from the first call, batch {b}, width {w}",
                        mlp_train(b, w), "warmup"))
    return out
