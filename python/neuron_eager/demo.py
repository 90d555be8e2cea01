"""Demo: train a small MLP classifier on `neuron` and check it against CPU eager.

Run with `python -m neuron_eager.demo` (the README's first command does it for you).
"""

import argparse
import copy
import time

import torch
import torch.nn as nn

import neuron_eager


def make_data(n: int, features: int, classes: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    y = (x @ w + 0.1 * torch.randn(n, classes, generator=g)).argmax(dim=1)
    return x, y


def train(model, x, y, steps: int, device: str):
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    losses = [float(l) for l in losses]  # host reads: wait for the queue
    elapsed = time.perf_counter() - start
    accuracy = float((model(x).argmax(dim=1) == y).float().mean())
    return model, losses, accuracy, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--mode", choices=neuron_eager.MODES, default=None)
    args = parser.parse_args()
    if args.mode:
        neuron_eager.set_mode(args.mode)

    torch.manual_seed(0)
    x, y = make_data(args.batch, 64, 10, seed=1)
    base = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.LayerNorm(256), nn.Linear(256, 10))
    print(f"neuron-eager demo: {torch.neuron.device_count()} NeuronCores, mode "
          f"{neuron_eager.get_mode()}, {args.steps} AdamW steps on a "
          f"{sum(p.numel() for p in base.parameters())}-parameter MLP")

    neuron_eager.reset_counters()
    dev_model, dev_losses, dev_acc, dev_time = train(copy.deepcopy(base), x, y, args.steps, "neuron")
    counters = neuron_eager.counters()
    cpu_model, cpu_losses, cpu_acc, cpu_time = train(copy.deepcopy(base), x, y, args.steps, "cpu")

    for step in (0, args.steps // 2, args.steps - 1):
        print(f"  step {step:4d}: loss neuron {dev_losses[step]:.6f}   cpu {cpu_losses[step]:.6f}")
    print(f"  accuracy: neuron {dev_acc:.3f}   cpu {cpu_acc:.3f}")
    print(f"  time: neuron {dev_time:.3f} s   cpu {cpu_time:.3f} s")
    print(f"  engine: {counters['ops_dispatched']} ops dispatched, {counters['ops_queued']} queued, "
          f"{counters['ops_synchronous']} run synchronously, shape cache "
          f"{counters['shape_cache_hits']} hits / {counters['shape_cache_misses']} misses")

    same_losses = dev_losses == cpu_losses
    same_weights = all(torch.equal(a.cpu(), b) for a, b in
                       zip(dev_model.state_dict().values(), cpu_model.state_dict().values()))
    print(f"  losses equal to CPU bit for bit: {same_losses}; weights equal: {same_weights}")
    if not (same_losses and same_weights):
        print("FAILED: neuron results differ from CPU eager")
        return 1
    print("OK: neuron training matches CPU eager exactly")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
