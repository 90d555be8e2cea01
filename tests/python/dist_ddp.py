"""DDP on `neuron` against the same DDP run on CPU tensors with Gloo.

Run under torchrun with 2 processes (tests/python/test_distributed.py).
`init_process_group()` gets no backend: the accelerator (`neuron`) picks the "neuron"
backend. The CPU oracle runs in the same processes on a Gloo group of its own. Both train
the same MLP for 20 AdamW steps on the same per-rank batches (plainly, and with no_sync
every 4th step), then a small Llama (transformers) the same way; losses of every step and
the final weights must be bit-equal. Rank 0 writes a summary to argv[1] (JSON).
"""

import copy
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 20


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(STEPS)]


def train(model, device, group, data, no_sync_every=0):
    # bucket_cap_mb small enough that the model's gradients take several buckets.
    ddp = DDP(model.to(device), process_group=group, bucket_cap_mb=0.01)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, foreach=False)
    losses = []
    for step, (x, y) in enumerate(data):
        x, y = x.to(device), y.to(device)
        if no_sync_every and step % no_sync_every == 0:
            with ddp.no_sync():  # gradients accumulate locally, the next step reduces both
                nn.functional.cross_entropy(ddp(x), y).backward()
            continue
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return [float(l) for l in losses], {k: v.detach().cpu() for k, v in ddp.module.state_dict().items()}


def train_llama(cpu_group, rank):
    """A small random-config Llama (transformers) under DDP, 20 AdamW steps, on CPU/Gloo and
    on neuron: losses and weights bit-equal. None when transformers is missing."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    base = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(200 + rank)
    batches = [torch.randint(3, config.vocab_size, (2, 16), generator=g) for _ in range(STEPS)]
    results = {}
    for device, group in (("cpu", cpu_group), ("neuron", None)):
        ddp = DDP(copy.deepcopy(base).to(device), process_group=group, bucket_cap_mb=0.05)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, foreach=False)
        losses = []
        for ids in batches:
            ids = ids.to(device)
            loss = ddp(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        results[device] = ([float(l) for l in losses],
                           {k: v.detach().cpu() for k, v in ddp.module.state_dict().items()})
    (cl, cw), (dl, dw) = results["cpu"], results["neuron"]
    assert cl == dl, f"llama: losses differ on rank {rank}:\n{cl}\n{dl}"
    for k in cw:
        assert torch.equal(cw[k], dw[k]), f"llama: weight {k} differs on rank {rank}"
    return dl


def main():
    dist.init_process_group(timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.neuron.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.neuron.device_count())
    backend = dist.get_default_backend_for_device("neuron")
    assert backend == "neuron", backend
    cpu_group = dist.new_group(backend="gloo")
    model = make_model()
    data = batches(rank)
    report = {"mode": os.environ.get("NEURON_EAGER_MODE", "eager")}
    for no_sync_every in (0, 4):
        name = "no_sync" if no_sync_every else "plain"
        cpu_losses, cpu_state = train(copy.deepcopy(model), "cpu", cpu_group, data, no_sync_every)
        dev_losses, dev_state = train(copy.deepcopy(model), "neuron", None, data, no_sync_every)
        assert cpu_losses == dev_losses, f"{name}: losses differ on rank {rank}:\n{cpu_losses}\n{dev_losses}"
        for k in cpu_state:
            assert torch.equal(cpu_state[k], dev_state[k]), f"{name}: weight {k} differs on rank {rank}"
        # DDP keeps replicas equal: rank 0's weights everywhere.
        flat = torch.cat([v.flatten() for v in dev_state.values()]).to("neuron")
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        assert torch.equal(flat.cpu(), ref.cpu()), f"{name}: replicas differ on rank {rank}"
        report[name] = {"losses": dev_losses, "steps": len(dev_losses)}
    llama_losses = train_llama(cpu_group, rank)
    if llama_losses is not None:
        report["llama"] = {"losses": llama_losses, "steps": len(llama_losses)}
    objs = [None] * dist.get_world_size()
    dist.all_gather_object(objs, {"rank": rank})
    assert [o["rank"] for o in objs] == list(range(dist.get_world_size()))
    import neuron_eager

    c = neuron_eager.counters()
    report["counters"] = {k: c[k] for k in ("ops_dispatched", "ops_in_fused_segments", "segments_fused",
                                            "programs", "guard_trials", "divergences")}
    if rank == 0 and len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
