"""torch.compile(backend="neuron"): each run of a captured graph is a compiled region whose
segments fuse from their first sighting, in eager mode too, with CPU eager's results."""

import pytest
import torch

import neuron_eager


def block(x, w1, w2):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), w1, w2)
    r = torch.nn.functional.gelu(h) * 1.5 + x
    y = r * torch.sigmoid(r) - 0.25 * x
    return torch.tanh(y) + y * y


def operands():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(64, 256, generator=g), torch.randn(256, generator=g),
            torch.randn(256, generator=g))


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    neuron_eager.set_mode("eager")
    neuron_eager.reset_fusion_state()  # every test's graphs start cold
    yield
    torch._dynamo.reset()
    neuron_eager.set_mode("eager")


def count(name):
    torch.neuron.synchronize()
    return neuron_eager.counters()[name]


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_graph_fuses_from_its_first_run(mode):
    neuron_eager.set_mode(mode)
    args = operands()
    expected = block(*args)
    dev = [a.to("neuron") for a in args]
    compiled = torch.compile(block, backend="neuron")
    runs0, programs0, fused0 = (count("compiled_region_runs"), count("programs"),
                                count("segments_fused"))
    first = compiled(*dev)
    assert torch.equal(first.cpu(), expected)
    assert count("compiled_region_runs") == runs0 + 1
    # The graph's segments got a program at their first sighting (no hot_threshold wait).
    assert count("programs") > programs0
    for _ in range(4):
        got = compiled(*dev)
        assert torch.equal(got.cpu(), expected)
    assert count("compiled_region_runs") == runs0 + 5
    assert count("segments_fused") > fused0


def test_ops_outside_the_graph_stay_per_op_in_eager_mode():
    args = [a.to("neuron") for a in operands()]
    compiled = torch.compile(block, backend="neuron")
    for _ in range(3):
        compiled(*args)
    fused = count("segments_fused")
    for _ in range(6):
        block(*args)  # the same ops, not compiled: eager mode runs them per op
    assert count("segments_fused") == fused


def test_graph_breaks_and_training_match_cpu():
    """A compiled module trains through a graph break (a host read): AOTAutograd's forward
    and backward graphs are each a region, losses and weights are CPU's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 1))
    data = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(2))

    def train(device, compiled):
        torch._dynamo.reset()
        m = __import__("copy").deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def step(x, y):
            out = m(x)
            loss = torch.nn.functional.mse_loss(out, y)
            if loss.item() > 1e9:  # a host read: Dynamo breaks the graph here
                loss = loss * 0
            return loss

        f = torch.compile(step, backend="neuron") if compiled else step
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = f(data.to(device), target.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in m.parameters()]

    cpu_losses, cpu_params = train("cpu", False)
    runs0 = count("compiled_region_runs")
    losses, params = train("neuron", True)
    assert losses == cpu_losses
    for a, b in zip(params, cpu_params):
        assert torch.equal(a, b)
    assert count("compiled_region_runs") >= runs0 + 10  # forward and backward per step


def test_region_cuts_show_in_traces(tmp_path):
    from neuron_eager import trace

    args = [a.to("neuron") for a in operands()]
    compiled = torch.compile(block, backend="neuron")
    compiled(*args)
    path = str(tmp_path / "t.ntrace")
    with trace.record(path):
        for _ in range(3):
            compiled(*args)
        torch.neuron.synchronize()
    summary = trace.summarize(trace.load(path))
    reasons = {r for g in summary.segments for r in g.cut_reasons}
    assert "compiled region" in reasons, reasons


def test_backend_failure_falls_back_with_one_warning(monkeypatch):
    """If AOTAutograd cannot take a graph, the graph still runs (as captured, in a region)
    with one warning naming the cause, never an error."""
    import torch._dynamo.backends.common as common

    def broken(**_kwargs):
        raise RuntimeError("simulated failure in the graph compiler")

    monkeypatch.setattr(common, "aot_autograd", broken)
    args = operands()
    expected = block(*args)
    dev = [a.to("neuron").requires_grad_() for a in args]  # a graph that needs autograd
    compiled = torch.compile(block, backend="neuron")
    with pytest.warns(UserWarning, match="simulated failure in the graph compiler"):
        got = compiled(*dev)
    assert torch.equal(got.detach().cpu(), expected)
    runs = count("compiled_region_runs")
    got.sum().backward()  # autograd still works (per op, outside any region)
    assert dev[0].grad is not None
    compiled(*dev)
    assert count("compiled_region_runs") == runs + 1


def test_dynamic_shapes_compile_at_first_sight_up_to_the_bound():
    """One graph over many shapes (Dynamo's automatic dynamic): region_max_programs keys
    compile at first sight, then new shapes wait for hot_threshold like any segment;
    results stay CPU's throughout."""
    neuron_eager.set_policy({"region_max_programs": 2})
    try:
        compiled = torch.compile(lambda x: torch.tanh(x * 2.0 + 1.0) * x - 0.5, backend="neuron")
        overflows0 = count("compiled_region_overflows")
        made = []
        for rows in (3, 5, 7, 9, 11, 13):
            x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(rows))
            before = count("programs")
            got = compiled(x.to("neuron"))
            assert torch.equal(got.cpu(), torch.tanh(x * 2.0 + 1.0) * x - 0.5)
            made.append(count("programs") - before)
        # The first shape's static graph makes one; the dynamic graph Dynamo recompiles for
        # the second shape makes two more at first sight, then stops.
        assert sum(made[:3]) == 3 and made[3:] == [0, 0, 0], made
        assert count("compiled_region_overflows") == overflows0 + 1
    finally:
        neuron_eager.set_policy("default")


def test_compiled_optimizer_step_matches_cpu_capture():
    """torch.compile(optimizer.step): Dynamo's capture of AdamW already rounds differently
    from the uncompiled step on CPU itself (backend="eager" shows it), so the oracle is the
    same capture on CPU, with the same implementation (foreach=True: AdamW's default is
    foreach on neuron, the per-tensor loop on CPU): losses and weights bit-equal to it."""
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    y = torch.randn(8, 1, generator=torch.Generator().manual_seed(2))

    def train(device, backend):
        torch._dynamo.reset()
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)
        step = torch.compile(opt.step, backend=backend)
        losses = []
        for _ in range(4):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x.to(device)), y.to(device))
            loss.backward()
            step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in m.parameters()]

    cpu_losses, cpu_params = train("cpu", "eager")
    runs = count("compiled_region_runs")
    losses, params = train("neuron", "neuron")
    assert losses == cpu_losses
    assert all(torch.equal(a, b) for a, b in zip(params, cpu_params))
    assert count("compiled_region_runs") >= runs + 4


def test_compiled_graph_under_autocast_matches_cpu():
    """An autocast region around a compiled graph: bf16 linears on neuron, the result equal
    to the same capture under CPU autocast."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32)
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))

    def f(m, t):
        return torch.nn.functional.gelu(m(t)).sum(-1)

    def run(device, backend):
        torch._dynamo.reset()
        m = torch.nn.Linear(32, 32)
        m.load_state_dict(lin.state_dict())
        m = m.to(device)
        g = torch.compile(f, backend=backend)
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            out = g(m, x.to(device))
        assert out.dtype == torch.bfloat16
        return out.float().cpu()

    assert torch.equal(run("neuron", "neuron"), run("cpu", "eager"))


def _autotune_fn(x, y):
    # A chain no other test compiles, so its kernel is not in the session's cache yet.
    return torch.maximum((x.abs() + 0.5).rsqrt(), y) * x - y.neg() * 0.75


def test_max_autotune_builds_tier2_kernels_before_the_first_call_returns():
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(256, 512, generator=g), torch.randn(256, 512, generator=g)  # a tile group (>= min_group_elements)
    expected = _autotune_fn(x, y)
    dev = (x.to("neuron"), y.to("neuron"))
    before = {k: count(k) for k in ("native_requested", "native_built", "native_disk_hits", "native_runs")}
    compiled = torch.compile(_autotune_fn, backend="neuron", mode="max-autotune")
    first = compiled(*dev)  # per op: plans the graph's program
    second = compiled(*dev)  # fused: asks for its kernel and returns when it is built
    # No wait here (tier 2's cost gate needs native_min_runs tier-1 runs in the default
    # mode, and the build would run in the background).
    after = neuron_eager.counters()
    assert after["native_requested"] > before["native_requested"]
    assert (after["native_built"] - before["native_built"]) + (after["native_disk_hits"] - before["native_disk_hits"]) >= 1
    assert torch.equal(first.cpu(), expected)
    assert torch.equal(second.cpu(), expected)
    for _ in range(6):  # trials against tier 1, then the kernel alone
        assert torch.equal(compiled(*dev).cpu(), expected)
    assert count("native_runs") > before["native_runs"]


def test_default_mode_waits_for_tier2_cost_gate():
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(256, 384, generator=g), torch.randn(256, 384, generator=g)
    dev = (x.to("neuron"), y.to("neuron"))
    requested = count("native_requested")
    compiled = torch.compile(lambda a, b: (a * 1.25 + b).abs() - b * a, backend="neuron")
    assert torch.equal(compiled(*dev).cpu(), (x * 1.25 + y).abs() - y * x)
    neuron_eager._C.native_wait_idle()
    assert count("native_requested") == requested


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "max-speed"}, "mode 'max-speed' is not supported; expected one of 'default', 'reduce-overhead'"),
    ({"options": {"triton.cudagraphs": True}}, r"unknown option\(s\) triton.cudagraphs; allowed: max_autotune"),
    ({"options": {"max_autotune": "yes"}}, "max_autotune must be True or False"),
])
def test_bad_mode_or_options_is_one_clear_error(kwargs, match):
    compiled = torch.compile(lambda a: a * 2, backend="neuron", **kwargs)
    with pytest.raises(Exception, match=match):
        compiled(torch.ones(4, device="neuron"))


def test_reduce_overhead_and_max_autotune_option_compile():
    x = torch.randn(32, 64)
    for kwargs in ({"mode": "reduce-overhead"}, {"options": {"max_autotune": True}},
                   {"mode": "max-autotune-no-cudagraphs"}):
        torch._dynamo.reset()
        compiled = torch.compile(lambda a: torch.sigmoid(a) * a + 1, backend="neuron", **kwargs)
        assert torch.equal(compiled(x.to("neuron")).cpu(), torch.sigmoid(x) * x + 1)


@pytest.mark.parametrize("opt_class", [torch.optim.AdamW, torch.optim.Adam])
def test_compiled_adam_is_one_foreach_run_with_tier2_and_matches_cpu_capture(opt_class):
    """Dynamo traces Adam's lerp as sub + a full_like per element + addcmul_, and its bias
    corrections as 0-dim CPU tensors dividing device lists. The backend rewrites both (add_
    with alpha; the corrections as numbers), so the step is one run of foreach ops that a
    tier-2 kernel covers, with the CPU capture's bits (max-autotune: kernels from the 3rd
    call)."""
    g = torch.Generator().manual_seed(5)
    init = [torch.randn(256, 256, generator=g), torch.randn(256, generator=g), torch.randn(64, 256, generator=g)]
    grads = [[torch.randn(t.shape, generator=g) for t in init] for _ in range(3)]

    def run(device, backend, **kw):
        torch._dynamo.reset()
        params = [t.clone().to(device).requires_grad_() for t in init]
        opt = opt_class(params, lr=1e-2, weight_decay=0.01, foreach=True)
        step = torch.compile(opt.step, backend=backend, **kw)
        ops = []
        for i in range(8):
            for p, gr in zip(params, grads[i % 3]):
                p.grad = gr.to(device)
            before = count("ops_dispatched") if device == "neuron" else 0
            step()
            ops.append(count("ops_dispatched") - before if device == "neuron" else 0)
        return [p.detach().cpu() for p in params], ops

    want, _ = run("cpu", "eager")
    runs = count("native_runs")
    got, ops = run("neuron", "neuron", mode="max-autotune")
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert count("native_runs") > runs
    # Ten foreach ops a step on the device (weight decay: AdamW's mul_, Adam's add of the
    # weights to the gradients; sub, add_, mul_, addcmul_, sqrt, div_, add_, div_,
    # addcdiv_), not thirteen (a fill_ per element for the lerp's weights).
    assert ops[1:] == [10] * 7, ops


def test_compiled_adamw_in_bf16_keeps_its_fills_and_matches_cpu_capture():
    """A bf16 fill rounds the lerp weight to bf16, add's alpha would not: bf16 steps are
    not rewritten (more than ten ops a step) and still equal the CPU capture."""
    g = torch.Generator().manual_seed(6)
    init = [torch.randn(64, 32, generator=g).bfloat16(), torch.randn(32, generator=g).bfloat16()]
    grads = [torch.randn(t.shape, generator=g).bfloat16() for t in init]

    def run(device, backend):
        torch._dynamo.reset()
        params = [t.clone().to(device).requires_grad_() for t in init]
        opt = torch.optim.AdamW(params, lr=1e-2, foreach=True)
        step = torch.compile(opt.step, backend=backend)
        ops = 0
        for _ in range(4):
            for p, gr in zip(params, grads):
                p.grad = gr.to(device)
            before = count("ops_dispatched") if device == "neuron" else 0
            step()
            ops = count("ops_dispatched") - before if device == "neuron" else 0
        return [p.detach().cpu() for p in params], ops

    want, _ = run("cpu", "eager")
    got, ops = run("neuron", "neuron")
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert ops > 10
