"""How much of DDP's communication on `neuron` hides behind backward, and DDP step time
against the same DDP on CPU tensors with Gloo.

    python bench/python/ddp_overlap.py                   # 2 processes, MLP 6 x 512
    python bench/python/ddp_overlap.py --nproc 4 --width 1024 --bucket-mb 4
    python bench/python/ddp_overlap.py --model llama      # the suite's small Llama

Launches itself under `torch.distributed.run --standalone`. Each rank trains the same model
under DDP twice in turn, on CPU tensors (Gloo) and on neuron tensors (the neuron backend),
in blocks of steps that alternate by round (medians of the block times). Then rank 0
records a trace of the neuron steps: the communication time is the collective stream's
time in DDP's all-reduces (Collective events, waiting for the peer included), and the
hidden part is what of it overlaps device work (OpExecute/SegmentExecute) on the core's
other streams. Figures only, nothing asserted.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def intervals(ev):
    return sorted(zip(ev["time_ns"].tolist(), (ev["time_ns"] + ev["duration_ns"]).tolist()))


def union(spans):
    out = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap(a, b):
    """Total length of the intersection of two sorted, disjoint interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import neuron_eager.trace as nt
    from neuron_eager.trace.format import COLLECTIVE, OP_EXECUTE, SEGMENT_EXECUTE

    dist.init_process_group("cpu:gloo,neuron:neuron")
    rank = dist.get_rank()
    torch.neuron.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.neuron.device_count())
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(rank)
    if args.model == "llama":  # the suite's small Llama (4 layers, hidden 256), causal LM loss
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=1024, hidden_size=args.width, intermediate_size=args.width * 43 // 16,
                             num_hidden_layers=args.depth, num_attention_heads=8, num_key_value_heads=4,
                             max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        base = LlamaForCausalLM(config)
        x = torch.randint(3, config.vocab_size, (args.batch, args.seq), generator=g)
        y = x
        loss_of = lambda model, xd, yd: model(input_ids=xd, labels=yd).loss
        described = f"Llama {args.depth} layers x {args.width}, batch {args.batch} x {args.seq}"
    else:
        layers = []
        for _ in range(args.depth):
            layers += [nn.Linear(args.width, args.width), nn.GELU()]
        base = nn.Sequential(*layers, nn.Linear(args.width, 10))
        x, y = torch.randn(args.batch, args.width, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
        loss_of = lambda model, xd, yd: nn.functional.cross_entropy(model(xd), yd)
        described = f"MLP {args.depth} x {args.width}, batch {args.batch}"

    runs = {}
    for device in ("cpu", "neuron"):
        import copy

        model = DDP(copy.deepcopy(base).to(device), bucket_cap_mb=args.bucket_mb)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        xd, yd = x.to(device), y.to(device)

        def step(model=model, opt=opt, xd=xd, yd=yd):
            loss_of(model, xd, yd).backward()
            opt.step()
            opt.zero_grad()

        runs[device] = step

    def block(device, steps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            runs[device]()
        if device == "neuron":
            torch.neuron.synchronize()
        return (time.perf_counter() - start) / steps

    for d in runs:
        block(d, 5)  # warm-up
    times = {"cpu": [], "neuron": []}
    for r in range(args.rounds):
        for d in (("cpu", "neuron") if r % 2 == 0 else ("neuron", "cpu")):
            times[d].append(block(d, args.steps))

    path = os.path.join(tempfile.mkdtemp(), f"rank{rank}.ntrace")
    with nt.record(path):
        block("neuron", args.steps)
    if rank == 0:
        t = nt.load(path)
        ev = t.events
        coll = ev[ev["kind"] == COLLECTIVE]
        allreduce = coll[[t.string(int(v)) == "allreduce" for v in coll["value"].tolist()]]
        work = ev[((ev["kind"] == OP_EXECUTE) | (ev["kind"] == SEGMENT_EXECUTE)) & (ev["stream"] != coll["stream"][0])]
        comm = union(intervals(allreduce))
        hidden = overlap(comm, union(intervals(work)))
        total = sum(e - s for s, e in comm)
        cpu, neuron = statistics.median(times["cpu"]), statistics.median(times["neuron"])
        print(f"{dist.get_world_size()} processes, {described}, "
              f"buckets of {args.bucket_mb} MB, median of {args.rounds} blocks of {args.steps} steps")
        print(f"DDP step: gloo on CPU tensors {cpu * 1e3:.2f} ms, neuron {neuron * 1e3:.2f} ms "
              f"(neuron/cpu time {neuron / cpu:.2f}x)")
        print(f"neuron all-reduces in {args.steps} traced steps: {len(allreduce)}, "
              f"{sum(allreduce['aux'].tolist()) / 1e6:.1f} MB, collective stream busy {total / 1e6:.1f} ms, "
              f"hidden behind device work {hidden / 1e6:.1f} ms ({hidden / max(total, 1):.0%})")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", choices=("mlp", "llama"), default="mlp")
    p.add_argument("--depth", type=int, default=None, help="layers (MLP 6, Llama 4)")
    p.add_argument("--width", type=int, default=None, help="hidden size (MLP 512, Llama 256)")
    p.add_argument("--batch", type=int, default=None, help="MLP 64, Llama 4")
    p.add_argument("--seq", type=int, default=128, help="Llama sequence length")
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    defaults = {"mlp": (6, 512, 64), "llama": (4, 256, 4)}[args.model]
    args.depth, args.width, args.batch = (v if v is not None else d for v, d in zip((args.depth, args.width, args.batch), defaults))
    if args.worker:
        return worker(args)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           os.path.abspath(__file__), "--worker"]
    for k in ("model", "depth", "width", "batch", "seq", "bucket_mb", "steps", "rounds"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")))


if __name__ == "__main__":
    main()
