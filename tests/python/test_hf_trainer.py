"""transformers' Trainer and accelerate pick `neuron` unchanged (issue 24 item 4).

Both libraries detect TorchNeuron's device by finding a `torch_neuronx` package; ours
(python/torch_neuronx) is that name. Then TrainingArguments' device is neuron:0, the model
trains there (checked at every step), evaluates, saves and resumes; gradient accumulation,
clipping and the LR schedule give CPU's losses bit for bit; bf16=True autocasts on neuron.
"""

import importlib.util

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed")

from transformers import (LlamaConfig, LlamaForCausalLM, Trainer,  # noqa: E402
                          TrainerCallback, TrainingArguments)

VOCAB = 128
STEPS = 6


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        self.ids = torch.randint(3, VOCAB, (n, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0))


class OnDevice(TrainerCallback):
    """Records where the parameters are at every optimizer step."""

    def __init__(self):
        self.devices = set()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.devices |= {p.device.type for p in model.parameters()}


def arguments(out, use_cpu, **extra):
    kw = dict(output_dir=str(out), per_device_train_batch_size=4, gradient_accumulation_steps=2,
              max_steps=STEPS, learning_rate=3e-3, warmup_steps=2, lr_scheduler_type="linear",
              max_grad_norm=0.5, logging_steps=1, save_steps=3, seed=0, report_to=[],
              use_cpu=use_cpu, disable_tqdm=True, dataloader_num_workers=0)
    kw.update(extra)
    return TrainingArguments(**kw)


def fit(out, use_cpu, resume=None):
    watch = OnDevice()
    trainer = Trainer(model=build(), args=arguments(out, use_cpu), train_dataset=Tokens(32, 0),
                      eval_dataset=Tokens(8, 1), callbacks=[watch])
    trainer.train(resume_from_checkpoint=resume)
    logs = [(h["step"], h["loss"], h["grad_norm"], h["learning_rate"])
            for h in trainer.state.log_history if "loss" in h]
    eval_loss = trainer.evaluate()["eval_loss"]
    state = {k: v.cpu() for k, v in trainer.model.state_dict().items()}
    return logs, eval_loss, state, watch.devices


def test_libraries_detect_neuron():
    from accelerate.utils import imports as acc_imports
    from transformers.utils import import_utils as tf_imports

    import torch_neuronx

    assert torch_neuronx.IS_NEURON_EAGER
    assert importlib.util.find_spec("torch_neuronx") is not None
    assert tf_imports.is_torch_neuron_available()
    assert acc_imports.is_neuron_available()
    assert acc_imports.get_torch_accelerator_backend() == ("neuron", torch.neuron)
    assert TrainingArguments(output_dir="unused", report_to=[]).device == torch.device("neuron:0")
    args = TrainingArguments(output_dir="unused", report_to=[], torch_compile=True)
    assert args.torch_compile_backend == "neuron"
    assert TrainingArguments(output_dir="unused", report_to=[], use_cpu=True).device.type == "cpu"
    # accelerate on its own (its process state is shared: start it afresh): the
    # Accelerator's device, and the distributed backend it maps neuron to.
    from accelerate.state import AcceleratorState
    from accelerate.utils.constants import TORCH_DISTRIBUTED_BACKENDS

    AcceleratorState._reset_state(reset_partial_state=True)
    assert accelerate.Accelerator().device.type == "neuron"
    AcceleratorState._reset_state(reset_partial_state=True)
    assert TORCH_DISTRIBUTED_BACKENDS.get("neuron") == "neuron"


def test_trainer_trains_evaluates_saves_resumes_like_cpu(tmp_path):
    ref_logs, ref_eval, ref_state, ref_devices = fit(tmp_path / "cpu", use_cpu=True)
    logs, eval_loss, state, devices = fit(tmp_path / "neuron", use_cpu=False)
    assert ref_devices == {"cpu"} and devices == {"neuron"}
    assert [s for s, *_ in logs] == list(range(1, STEPS + 1))
    assert logs == ref_logs, f"\nneuron: {logs}\ncpu:    {ref_logs}"
    assert eval_loss == ref_eval
    for k, v in ref_state.items():
        assert torch.equal(state[k], v), f"{k} differs after training"
    # The schedule warmed up then decayed, and clipping was active (norms over 0.5).
    rates = [lr for *_, lr in logs]
    assert rates[0] < rates[1] and rates[-1] < rates[1]
    assert max(norm for _, _, norm, _ in logs) > 0.5
    # The checkpoint of step 3 resumes to the same steps 4-6 and the same final weights.
    checkpoint = tmp_path / "neuron" / "checkpoint-3"
    assert (checkpoint / "model.safetensors").exists()
    resumed_logs, resumed_eval, resumed_state, resumed_devices = fit(
        tmp_path / "neuron", use_cpu=False, resume=str(checkpoint))
    assert resumed_devices == {"neuron"}
    assert resumed_logs[-3:] == logs[-3:]
    assert resumed_eval == eval_loss
    for k, v in state.items():
        assert torch.equal(resumed_state[k], v), f"{k} differs after resuming"


def bf16_losses(out, use_cpu):
    args = arguments(out, use_cpu=use_cpu, bf16=True, max_steps=2, save_strategy="no")
    trainer = Trainer(model=build(), args=args, train_dataset=Tokens(16, 0))
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_bf16_autocasts_on_neuron(tmp_path):
    model = build()
    seen = []
    model.model.layers[0].mlp.gate_proj.register_forward_hook(
        lambda module, inputs, output: seen.append((output.dtype, output.device.type)))
    args = arguments(tmp_path, use_cpu=False, bf16=True, max_steps=2, save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(16, 0))
    trainer.train()
    assert trainer.accelerator.mixed_precision == "bf16"
    assert seen and set(seen) == {(torch.bfloat16, "neuron")}
    # Autocast leaves the master weights in float32.
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    # The same autocast policy as CPU's: the losses are CPU autocast's, bit for bit.
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2
    assert losses == bf16_losses(tmp_path / "cpu", use_cpu=True)


def test_finetune_example_trains_on_neuron(tmp_path):
    """examples/finetune_trainer.py, the README's example, runs as a user would run it."""
    import importlib.util as util
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = util.spec_from_file_location("finetune_trainer", os.path.join(root, "examples", "finetune_trainer.py"))
    example = util.module_from_spec(spec)
    spec.loader.exec_module(example)
    trainer = example.main(["--steps", "6", "--out", str(tmp_path)])
    assert {p.device.type for p in trainer.model.parameters()} == {"neuron"}
    losses = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    saved = LlamaForCausalLM.from_pretrained(tmp_path)  # the saved model loads on CPU
    for k, v in saved.state_dict().items():
        assert torch.equal(v, trainer.model.state_dict()[k].cpu()), k


def test_trainer_torch_compile_uses_the_neuron_backend(tmp_path):
    """torch_compile=True picks backend "neuron" (transformers' TorchNeuron path) and gives
    CPU eager's losses."""
    from torch._dynamo.utils import counters

    def losses(out, use_cpu, compile_):
        args = arguments(out, use_cpu=use_cpu, torch_compile=compile_, max_steps=2,
                         save_strategy="no")
        trainer = Trainer(model=build(), args=args, train_dataset=Tokens(16, 0))
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], args

    expected, _ = losses(tmp_path / "cpu", True, False)
    torch._dynamo.reset()
    counters.clear()
    got, args = losses(tmp_path / "neuron", False, True)
    assert args.torch_compile_backend == "neuron"
    assert counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    assert got == expected
