"""Tensor parallelism x FSDP2 on a 2-D DeviceMesh: a small Llama trained on `neuron`
against the same run on CPU tensors with Gloo.

    python bench/python/tp_fsdp.py                     # 4 processes: dp 2 x tp 2
    python bench/python/tp_fsdp.py --nproc 2 --tp 2    # tensor parallel only (dp 1)
    python bench/python/tp_fsdp.py --tiny --steps 3 --rounds 1   # the smoke test's size

Launches itself under `torch.distributed.run --standalone`. One "cpu:gloo,neuron:neuron"
group serves a CPU mesh and a neuron mesh of shape (dp, tp). On each, a random-config
LlamaForCausalLM gets Megatron-style tensor parallelism on every decoder layer over the
"tp" dimension (q/k/v and gate/up projections column-wise, o and down projections
row-wise: parallelize_module) and FSDP2 over the "dp" dimension (fully_shard per layer and
whole); ranks of one dp index see the same batches. Both models train --steps AdamW steps
first: the losses of every step must be bit-equal (exit 1 otherwise). Then blocks of
--block steps alternate between the two, the order alternating by round, and the median
block times give the step time of each; at the end the full weights (gathered) must again
be bit-equal. Prints one JSON line (rank 0) after "RESULT ".
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.tiny:
        config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2)
    else:
        config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2)
    import torch

    torch.manual_seed(0)
    return config, LlamaForCausalLM(config)


def parallelize(base, device, dp, tp):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))
    model = copy.deepcopy(base).to(device)
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], plan)
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    return model, opt


def full_weights(model):
    return {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}


def worker(args):
    import torch
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,neuron:neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide {world} processes")
    dp = world // args.tp
    torch.neuron.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.neuron.device_count())
    config, base = build(args)
    g = torch.Generator().manual_seed(1000 + rank // args.tp)  # one data stream per dp index
    batches = [torch.randint(3, config.vocab_size, (args.batch, args.seq), generator=g) for _ in range(8)]
    runs, losses = {}, {}
    for device in ("cpu", "neuron"):
        model, opt = parallelize(base, device, dp, args.tp)
        state = {"n": 0}

        def step(model=model, opt=opt, device=device, state=state):
            ids = batches[state["n"] % len(batches)].to(device)
            state["n"] += 1
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        runs[device] = (model, step)
        losses[device] = [float(step()) for _ in range(args.steps)]
    if losses["cpu"] != losses["neuron"]:
        raise SystemExit(f"rank {rank}: losses differ\ncpu    {losses['cpu']}\nneuron {losses['neuron']}")

    def block(device):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.block):
            runs[device][1]()
        if device == "neuron":
            torch.neuron.synchronize()
        return (time.perf_counter() - start) / args.block

    times = {"cpu": [], "neuron": []}
    for r in range(args.rounds):
        for d in (("cpu", "neuron") if r % 2 == 0 else ("neuron", "cpu")):
            times[d].append(block(d))
    weights = {d: full_weights(runs[d][0]) for d in runs}
    differ = [k for k in weights["cpu"] if not torch.equal(weights["cpu"][k], weights["neuron"][k])]
    if differ:
        raise SystemExit(f"rank {rank}: weights differ after timing: {differ[:5]}")
    if rank == 0:
        cpu, neuron = statistics.median(times["cpu"]), statistics.median(times["neuron"])
        result = {"world": world, "dp": dp, "tp": args.tp, "tiny": args.tiny, "steps_checked": args.steps,
                  "losses": losses["neuron"], "cpu_step_s": cpu, "neuron_step_s": neuron,
                  "cpu_over_neuron": cpu / neuron, "rounds": args.rounds, "block": args.block,
                  "params": sum(v.numel() for v in weights["cpu"].values())}
        os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree; dp = nproc / tp")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide Llama")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=10, help="steps whose losses are compared")
    p.add_argument("--block", type=int, default=3, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           os.path.abspath(__file__), "--worker"]
    for k in ("tp", "batch", "seq", "steps", "block", "rounds"):
        cmd += [f"--{k}", str(getattr(args, k))]
    if args.tiny:
        cmd.append("--tiny")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"tp_fsdp: the {args.nproc}-process run failed ({proc.returncode})")
    r = json.loads(lines[-1][7:])
    print(f"{r['world']} processes, mesh dp {r['dp']} x tp {r['tp']}, Llama of {r['params'] / 1e6:.2f}M parameters, "
          f"batch {args.batch} x {args.seq} per dp rank")
    print(f"losses of {r['steps_checked']} AdamW steps bit-equal to CPU/Gloo: {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}; "
          f"final weights bit-equal after {r['rounds']} rounds of {r['block']}-step blocks")
    print(f"step time: CPU/Gloo {r['cpu_step_s'] * 1e3:.1f} ms, neuron {r['neuron_step_s'] * 1e3:.1f} ms "
          f"(CPU/neuron {r['cpu_over_neuron']:.2f}x, medians of {r['rounds']} blocks)")
    print("RESULT " + json.dumps(r))


if __name__ == "__main__":
    main()
