"""Autograd + optimizer training on `neuron` must match CPU bit for bit.

The backend runs the same ATen CPU kernels (asynchronously, on a worker thread), so an
identical model, identical data and an identical optimizer must give identical losses,
gradients and weights at every step, not merely close ones.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import neuron_eager

STEPS = 20
DEV = "neuron"


def make_mlp(norm=None):
    return nn.Sequential(
        nn.Linear(32, 64), nn.GELU(),
        nn.LayerNorm(64) if norm == "layer" else nn.Identity(),
        nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )


class SmallCNN(nn.Module):
    def __init__(self, norm="batch"):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.norm1 = nn.BatchNorm2d(8) if norm == "batch" else nn.LayerNorm([8, 8, 8])
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)   # 8x8 -> 4x4
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)               # 4x4 -> 2x2
        return self.fc(x.flatten(1))


def synthetic(shape, seed):
    """Fixed-seed batches (4 distinct ones, cycled) with labels a function of the inputs."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.Size(shape[1:]).numel()
    teacher = torch.randn(feats, 10, generator=g)
    xs = [torch.randn(shape, generator=g) for _ in range(4)]
    return [(x, (x.flatten(1) @ teacher).argmax(1)) for x in xs] * (STEPS // 4)


def mlp_data():
    return synthetic((16, 32), 1234)


def cnn_data():
    return synthetic((8, 3, 8, 8), 4321)


def train(model, data, device, foreach):
    model = model.to(device)
    model.train()
    assert all(p.device.type == device for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, foreach=foreach)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def assert_same_training(make_model, data, foreach):
    torch.manual_seed(0)
    cpu_model = make_model()
    dev_model = copy.deepcopy(cpu_model)
    cpu_losses, cpu_state = train(cpu_model, data, "cpu", foreach)
    dev_losses, dev_state = train(dev_model, data, DEV, foreach)
    torch.neuron.synchronize()

    assert len(dev_losses) == len(cpu_losses) == STEPS
    for step, (a, b) in enumerate(zip(dev_losses, cpu_losses)):
        assert torch.equal(a, b), f"step {step}: loss {a.item()!r} != cpu {b.item()!r}"
    # The model actually learned something (so equality is not between two no-ops).
    assert sum(cpu_losses[-4:]) < sum(cpu_losses[:4])

    assert dev_state.keys() == cpu_state.keys()
    for k in cpu_state:
        assert dev_state[k].device.type == "cpu"
        assert torch.equal(dev_state[k], cpu_state[k]), f"{k} differs from CPU after training"
    # Weights moved away from the initialisation.
    init = make_model_state_after_seed(make_model)
    assert any(not torch.equal(init[k], cpu_state[k]) for k in cpu_state if k.endswith("weight"))


def make_model_state_after_seed(make_model):
    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in make_model().state_dict().items()}


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
@pytest.mark.parametrize("norm", [None, "layer"], ids=["plain", "layernorm"])
def test_mlp_adamw_matches_cpu(norm, foreach):
    assert_same_training(lambda: make_mlp(norm), mlp_data(), foreach)


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_cnn_adamw_matches_cpu(norm, foreach):
    assert_same_training(lambda: SmallCNN(norm), cnn_data(), foreach)


def test_mlp_gradients_match_cpu():
    torch.manual_seed(0)
    cpu_model = make_mlp()
    dev_model = copy.deepcopy(cpu_model).to(DEV)
    x, y = mlp_data()[0]

    F.cross_entropy(cpu_model(x), y).backward()
    before = neuron_eager.counters()["ops_dispatched"]
    dev_loss = F.cross_entropy(dev_model(x.to(DEV)), y.to(DEV))
    assert dev_loss.device.type == DEV
    dev_loss.backward()
    torch.neuron.synchronize()
    assert neuron_eager.counters()["ops_dispatched"] > before, "backward ran no neuron ops"

    cpu_params = dict(cpu_model.named_parameters())
    for name, p in dev_model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient on {DEV}"
        assert p.grad.device.type == DEV, f"{name}: gradient on {p.grad.device}"
        ref = cpu_params[name].grad
        assert ref.abs().sum() > 0, f"{name}: reference gradient is zero"
        assert torch.equal(p.grad.cpu(), ref), f"{name}: gradient differs from CPU"


def test_input_gradient_matches_cpu():
    """Gradient w.r.t. a leaf input living on the device (not only parameters)."""
    torch.manual_seed(0)
    cpu_model = make_mlp()
    dev_model = copy.deepcopy(cpu_model).to(DEV)
    x, y = mlp_data()[0]
    x_cpu = x.clone().requires_grad_()
    x_dev = x.to(DEV).requires_grad_()
    F.cross_entropy(cpu_model(x_cpu), y).backward()
    F.cross_entropy(dev_model(x_dev), y.to(DEV)).backward()
    assert x_dev.grad is not None and x_dev.grad.device.type == DEV
    assert torch.equal(x_dev.grad.cpu(), x_cpu.grad)
