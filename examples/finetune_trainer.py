"""Fine-tune a causal language model with Hugging Face's Trainer on `neuron`.

Nothing here is specific to neuron-eager: `import torch` registers the `neuron` device, and
transformers/accelerate pick it (through the `torch_neuronx` name neuron-eager ships), so
TrainingArguments' device is neuron:0 and the model trains there. The same script runs on
CUDA unchanged.

    python examples/finetune_trainer.py                          # a small random Llama, offline
    python examples/finetune_trainer.py --model gpt2             # a hub model (needs its files)
    python examples/finetune_trainer.py --steps 200 --bf16       # longer, bf16 autocast
    NEURON_EAGER_MODE=adaptive python examples/finetune_trainer.py   # fused segments

The data is a few lines of text kept in memory, tokenised bytewise when no hub tokenizer
is used; swap in `datasets.load_dataset(...)` and a real tokenizer for your own corpus.
"""

import argparse

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          Trainer, TrainingArguments)

TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A NeuronCore runs tensor programs; this one is simulated on the host CPU.",
    "Eager mode runs each op as it comes; adaptive mode fuses the segments that repeat.",
    "Fine-tuning adapts a pretrained model to new text with a small learning rate.",
] * 8


class Bytes:
    """A byte-level tokenizer: ids 0-255 are bytes, 256 is padding."""

    pad_token_id = 256
    vocab_size = 257

    def __call__(self, text, length):
        ids = list(text.encode())[:length]
        return ids + [self.pad_token_id] * (length - len(ids)), [1] * len(ids) + [0] * (length - len(ids))

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode(errors="replace")


class TextDataset(torch.utils.data.Dataset):
    def __init__(self, lines, encode, length=64):
        self.rows = [encode(line, length) for line in lines]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, mask = self.rows[i]
        ids, mask = torch.tensor(ids), torch.tensor(mask)
        labels = ids.masked_fill(mask == 0, -100)  # no loss on padding
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def model_and_encoder(name):
    if name:
        tokenizer = AutoTokenizer.from_pretrained(name)
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token

        def encode(text, length):
            out = tokenizer(text, max_length=length, padding="max_length", truncation=True)
            return out["input_ids"], out["attention_mask"]

        return AutoModelForCausalLM.from_pretrained(name), encode, tokenizer.decode
    tokenizer = Bytes()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config), tokenizer, tokenizer.decode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="a hub model name (default: a small random Llama)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--out", default="finetune-out")
    args = p.parse_args(argv)

    model, encode, decode = model_and_encoder(args.model)
    train = TextDataset(TEXT, encode)
    evaluation = TextDataset(TEXT[:4], encode)
    training_args = TrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8,
        gradient_accumulation_steps=2, learning_rate=2e-3, warmup_steps=args.steps // 10,
        lr_scheduler_type="cosine", max_grad_norm=1.0, bf16=args.bf16, logging_steps=10,
        eval_strategy="steps", eval_steps=max(1, args.steps // 2), save_steps=max(1, args.steps // 2),
        report_to=[], seed=0)
    print(f"training on {training_args.device}")
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=evaluation)
    trainer.train()
    print("eval loss", trainer.evaluate()["eval_loss"])
    trainer.save_model(args.out)

    # Generate from the fine-tuned model (still on the device).
    prompt, mask = encode(TEXT[0][:12], 12)
    ids = torch.tensor([prompt[:sum(mask)]], device=training_args.device)
    with torch.no_grad():
        out = trainer.model.eval().generate(ids, max_new_tokens=32, do_sample=False,
                                            pad_token_id=model.config.pad_token_id)
    print("sample:", decode(out[0].tolist()))
    return trainer


if __name__ == "__main__":
    main()
