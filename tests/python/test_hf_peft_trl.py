"""PEFT LoRA and TRL's SFTTrainer on `neuron`, loss by loss equal to CPU (issue 24 item 5).

Offline: a tiny random Llama and a character-level tokenizer built in memory.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
peft = pytest.importorskip("peft", reason="peft is not installed (tools/setup.sh installs it)")
trl = pytest.importorskip("trl", reason="trl is not installed (tools/setup.sh installs it)")
datasets = pytest.importorskip("datasets", reason="datasets is not installed (trl needs it)")

from tokenizers import Regex, Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

CHARS = list("abcdefghijklmnopqrstuvwxyz .,")
VOCAB = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>"] + CHARS)}
STEPS = 10


def build():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=1))


def tokenizer():
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def batch(device):
    ids = torch.randint(3, len(VOCAB), (4, 16), generator=torch.Generator().manual_seed(5))
    return ids.to(device)


def lora(model):
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                             target_modules=["q_proj", "v_proj", "down_proj"])
    model = peft.get_peft_model(model, config)
    # LoRA's B starts at zero: give it values so merging changes the weights.
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model


def lora_train(device):
    model = lora(build()).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids, losses = batch(device), []
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert {p.device.type for p in model.parameters()} == {device}
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


def test_lora_trains_merges_saves_and_loads_like_cpu(tmp_path):
    ref_model, ref_losses = lora_train("cpu")
    model, losses = lora_train("neuron")
    assert losses == ref_losses, f"\nneuron: {losses}\ncpu:    {ref_losses}"
    assert ref_losses[-1] < ref_losses[0]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    ids = batch("cpu")
    with torch.no_grad():
        ref_logits = ref_model(ids).logits
        logits = model(ids.to("neuron")).logits.cpu()
    assert torch.equal(logits, ref_logits)
    # Adapters saved from neuron load onto a fresh base on neuron and give the same logits.
    model.save_pretrained(tmp_path / "adapter")
    loaded = peft.PeftModel.from_pretrained(build().to("neuron"), tmp_path / "adapter")
    with torch.no_grad():
        assert torch.equal(loaded(ids.to("neuron")).logits.cpu(), ref_logits)
    # Merging folds the adapters into the base weights, as on CPU.
    merged = copy.deepcopy(model).merge_and_unload()
    ref_merged = copy.deepcopy(ref_model).merge_and_unload()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    for (name, p), (_, q) in zip(merged.named_parameters(), ref_merged.named_parameters()):
        assert p.device.type == "neuron" and torch.equal(p.cpu(), q), name
    with torch.no_grad():
        assert torch.equal(merged(ids.to("neuron")).logits.cpu(), ref_merged(ids).logits)


def sft(use_cpu, out, **extra):
    data = datasets.Dataset.from_dict({"text": [
        "the quick brown fox", "jumps over the lazy dog", "a small model learns",
        "eager mode on neuron"] * 4})
    kw = dict(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4, logging_steps=1,
              report_to=[], use_cpu=use_cpu, save_strategy="no", seed=0, learning_rate=3e-3,
              disable_tqdm=True)
    kw.update(extra)
    trainer = trl.SFTTrainer(model=build(), args=trl.SFTConfig(**kw), train_dataset=data,
                             processing_class=tokenizer())
    trainer.train()
    devices = {p.device.type for p in trainer.model.parameters()}
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], devices, trainer


def test_sft_trainer_matches_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CI", "1")  # TRL's telemetry stays off in tests
    # TRL pads to multiples of 128 on neuron ("auto"): both runs get the same padding.
    ref, ref_devices, _ = sft(True, tmp_path / "cpu", pad_to_multiple_of=128)
    got, devices, _ = sft(False, tmp_path / "neuron", pad_to_multiple_of=128)
    assert ref_devices == {"cpu"} and devices == {"neuron"}
    assert len(got) == STEPS and got == ref, f"\nneuron: {got}\ncpu:    {ref}"
    assert ref[-1] < ref[0]
    # TRL's own neuron path: "auto" padding picks 128 for the neuron device.
    _, _, trainer = sft(False, tmp_path / "auto", max_steps=1)
    assert trainer.args.pad_to_multiple_of == 128


def test_safetensors_load_file_onto_neuron(tmp_path):
    # peft >= 0.22 asks safetensors for the device torch.accelerator reports ("neuron"),
    # which safetensors' Rust side rejects; neuron_eager teaches load_file the device.
    import subprocess
    import sys

    import safetensors.torch as st
    want = {"w": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64)}
    path = str(tmp_path / "t.safetensors")
    st.save_file(want, path)
    for device in ("neuron", "neuron:0", torch.device("neuron", 0)):
        got = st.load_file(path, device=device)
        assert set(got) == set(want)
        for k in want:
            assert got[k].device.type == "neuron"
            assert torch.equal(got[k].cpu(), want[k])
    assert st.load_file(path)["w"].device.type == "cpu"
    # Imported after neuron_eager (autoloaded by torch) in a fresh interpreter: the hook.
    code = ("import torch, safetensors.torch as st; t = st.load_file(%r, device='neuron'); "
            "print(t['w'].device, bool(t['b'].cpu().eq(torch.arange(5)).all()))" % path)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["neuron:0", "True"]
