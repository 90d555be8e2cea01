"""A tiny random mixtral-style mixture-of-experts model on `neuron` equals CPU eager (issue 24).

Transformers' grouped-mm experts path calls torch.histc on int32 expert ids on accelerators
(float ids on CPU): on neuron that is neuron::histc_int (engine/dtype_routes.cpp). Forward
logits, greedy tokens and 10 AdamW training steps (router aux loss included) must be bit
for bit CPU's, in eager mode here and in adaptive mode in a child process.
"""

import copy
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

DEV = "neuron"
VOCAB = 256
STEPS = 10


def build():
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=128, output_router_logits=True, router_aux_loss_coef=0.02,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    # The accelerator path under test: grouped experts, whose offsets come from histc.
    assert model.config._experts_implementation == "grouped_mm"
    return model


def inputs():
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(7))
    return ids, torch.ones_like(ids)


def infer(model, device):
    model = copy.deepcopy(model).to(device).eval()
    ids, mask = inputs()
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8,
                                min_new_tokens=8, do_sample=False, pad_token_id=0)
    return logits.cpu(), tokens.cpu()


def train(model, device):
    model = copy.deepcopy(model).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids, mask = inputs()
    ids, mask = ids.to(device), mask.to(device)
    losses = []
    for _ in range(STEPS):
        out = model(input_ids=ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        assert all(p.device.type == device and p.grad.device.type == device
                   for p in model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


def check_all():
    model = build()
    ref_logits, ref_tokens = infer(model, "cpu")
    logits, tokens = infer(model, DEV)
    assert ref_logits.std() > 1e-3, "degenerate reference logits"
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=0)
    assert torch.equal(tokens, ref_tokens), f"\nneuron: {tokens.tolist()}\ncpu:    {ref_tokens.tolist()}"
    ref_losses, ref_state = train(model, "cpu")
    losses, state = train(model, DEV)
    assert losses == ref_losses, f"\nneuron: {losses}\ncpu:    {ref_losses}"
    assert ref_losses[-1] < ref_losses[0], "training did not train"
    for k, v in ref_state.items():
        assert torch.equal(state[k], v), f"{k} differs after training"


def test_moe_eager_matches_cpu():
    check_all()


def test_moe_adaptive_matches_cpu():
    env = dict(os.environ, NEURON_EAGER_MODE="adaptive")
    here = os.path.dirname(__file__)
    r = subprocess.run([sys.executable, "-c", "import test_hf_moe as t; t.check_all()"],
                       cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_integer_histc_error_names_op_and_dtype():
    """An integer dtype CUDA's histc lacks too fails with an error naming op and dtype."""
    with pytest.raises(RuntimeError, match="aten::histc failed on neuron.*'Bool'"):
        torch.histc(torch.ones(4, dtype=torch.bool, device=DEV), bins=2)
        torch.neuron.synchronize()
