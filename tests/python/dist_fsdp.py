"""FSDP2 (fully_shard on a DeviceMesh) and DTensor on `neuron` against the same on CPU
tensors with Gloo.

Run under torchrun with 2 processes (tests/python/test_distributed.py). One process group
"cpu:gloo,neuron:neuron" serves a CPU mesh and a neuron mesh. The same MLP is sharded per
layer and as a whole, and trained 20 AdamW steps on each; losses and the full (gathered)
weights must be bit-equal. Then a row-sharded DTensor matmul must give CPU's result, and a
column/row-wise tensor-parallel MLP (parallelize_module) trains bit-equal to CPU's.
With a folder as argv[1], the FSDP2 run on neuron is saved there with
torch.distributed.checkpoint (and rank 0's gathered weights as full_weights.pt), for
test_distributed.py to load in one process.
Prints one "OK <name>" line per check.
"""

import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

STEPS = 20


def say(line):
    """One write per line: the ranks share torchrun's stdout, and print() may split a line
    into two writes that another rank's output lands between."""
    os.write(1, (line + "\n").encode())


def train_tp(base, device):
    """Column-wise then row-wise sharded linears (Megatron style MLP), 5 AdamW steps."""
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    model = parallelize_module(copy.deepcopy(base).to(device), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(5)  # the same batches on every rank
    losses = []
    for _ in range(5):
        loss = model(torch.randn(8, 32, generator=g).to(device)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return [float(l) for l in losses], {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}


def train_fsdp(base, device, rank, checkpoint=None):
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    model = copy.deepcopy(base).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    if checkpoint:  # each rank writes its shards of the neuron model
        dcp.save(model.state_dict(), checkpoint_id=checkpoint)
    weights = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    return [float(l) for l in losses], weights


def dtensor_matmul(device):
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    g = torch.Generator().manual_seed(7)  # the same full tensors on every rank
    w, x = torch.randn(8, 6, generator=g), torch.randn(6, 5, generator=g)
    dw = distribute_tensor(w.to(device), mesh, [Shard(0)])
    dx = distribute_tensor(x.to(device), mesh, [Replicate()])
    return (dw @ dx).redistribute(mesh, [Replicate()]).to_local().cpu()


def main():
    dist.init_process_group("cpu:gloo,neuron:neuron", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.neuron.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.neuron.device_count())
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 10))
    checkpoint = sys.argv[1] if len(sys.argv) > 1 else None
    cpu_losses, cpu_weights = train_fsdp(base, "cpu", rank)
    dev_losses, dev_weights = train_fsdp(base, "neuron", rank, checkpoint)
    if checkpoint and rank == 0:  # the reference for loading at another world size
        torch.save(dev_weights, os.path.join(checkpoint, "full_weights.pt"))
    assert cpu_losses == dev_losses, f"FSDP2 losses differ on rank {rank}:\n{cpu_losses}\n{dev_losses}"
    assert len(set(dev_losses)) > 1
    for k in cpu_weights:
        assert torch.equal(cpu_weights[k], dev_weights[k]), f"FSDP2 weight {k} differs on rank {rank}"
    if rank == 0:
        say("OK fsdp2")
    c, d = dtensor_matmul("cpu"), dtensor_matmul("neuron")
    assert torch.equal(c, d), f"DTensor matmul differs on rank {rank}"
    if rank == 0:
        say("OK dtensor")
    tp_base = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    c_losses, c_weights = train_tp(tp_base, "cpu")
    d_losses, d_weights = train_tp(tp_base, "neuron")
    assert c_losses == d_losses, f"TP losses differ on rank {rank}"
    assert all(torch.equal(c_weights[k], d_weights[k]) for k in c_weights), f"TP weights differ on rank {rank}"
    if rank == 0:
        say("OK tensor_parallel")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
