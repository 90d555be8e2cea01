"""Weight loading and checkpoints between `neuron` and CPU (issue 24 item 7).

transformers 5 materialises checkpoint tensors on the target device from a thread pool
(TorchNeuron asks users to turn that off with HF_DEACTIVATE_ASYNC_LOAD=1; we must not need
it), and a checkpoint written from `neuron` must load on a machine without it.
"""

import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("accelerate", reason="accelerate is needed for device_map loading")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402


def build():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_async_sharded_load_onto_neuron(tmp_path, dtype):
    assert os.environ.get("HF_DEACTIVATE_ASYNC_LOAD") is None, "the async path is under test"
    model = build()
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert len(shards) > 5, "many shards: many tensors materialised from the pool at once"
    expected = {k: v.to(dtype) for k, v in model.state_dict().items()}
    # The oracle is the same checkpoint loaded on CPU (from_pretrained keeps the rotary
    # buffers in float32; model.to(bf16) would not).
    reference = LlamaForCausalLM.from_pretrained(tmp_path, dtype=dtype)
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = reference(ids).logits
    for _ in range(3):  # a race between the pool's threads would show as a changed tensor
        loaded = LlamaForCausalLM.from_pretrained(tmp_path, device_map="neuron", dtype=dtype)
        state = loaded.state_dict()
        assert state.keys() == expected.keys()
        for k, v in state.items():
            assert v.device.type == "neuron", f"{k} on {v.device}"
            assert v.dtype == dtype
            assert torch.equal(v.cpu(), expected[k]), f"{k} changed through async loading"
        with torch.no_grad():
            out = loaded(ids.to("neuron")).logits.cpu()
        assert torch.equal(out, ref)


CPU_ONLY_LOAD = """
import sys, torch
from transformers import LlamaForCausalLM
assert "neuron_eager" not in sys.modules and not hasattr(torch, "neuron")
model = LlamaForCausalLM.from_pretrained(sys.argv[1])
state = torch.load(sys.argv[2], map_location="cpu")
ref = torch.load(sys.argv[3])
for k, v in model.state_dict().items():
    assert v.device.type == "cpu" and torch.equal(v, ref[k]), k
    assert state[k].device.type == "cpu" and torch.equal(state[k], ref[k]), k
print("ok", len(ref))
"""


def test_checkpoints_saved_from_neuron_load_on_cpu(tmp_path):
    model = build().to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(2)).to("neuron")
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()  # weights that exist only on neuron
    model.save_pretrained(tmp_path / "hf")
    torch.save(model.state_dict(), tmp_path / "state.pt")
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, tmp_path / "ref.pt")
    # A process without the backend: autoloading off, so `neuron` does not exist there.
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    r = subprocess.run([sys.executable, "-c", CPU_ONLY_LOAD, str(tmp_path / "hf"),
                        str(tmp_path / "state.pt"), str(tmp_path / "ref.pt")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.startswith("ok")
