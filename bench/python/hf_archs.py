"""Every causal-LM architecture of the installed transformers, built from a tiny random config,
checked on `neuron` against CPU eager (issue 24 item 3). Shared by bench/python/hf_sweep.py
(the whole list, a table) and tests/python/test_hf_sweep.py (a fast subset).

One architecture's check: logits of a padded batch bit for bit equal to CPU's, then greedy
generation with the dynamic cache and with cache_implementation="static", tokens equal to
CPU's. An architecture that does not build from the tiny config, or whose CPU run fails,
is "skipped" with the reason (CPU is the oracle: nothing to compare); anything that differs
or fails only on neuron is "FAIL" with the reason.
"""

import copy
import importlib

import torch

VOCAB = 256
NEW_TOKENS = 6
MAX_PARAMETERS = 20_000_000

# Small values for every size attribute a config may have; set only where the config's
# defaults have the attribute (or an alias of it), so nothing foreign reaches a config.
TINY = {
    "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_heads": 4, "head_dim": 16,
    "intermediate_size": 128, "ffn_hidden_size": 128, "max_position_embeddings": 256,
    "n_positions": 256, "n_ctx": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128,
    "d_model": 64, "d_ff": 128, "d_kv": 16, "decoder_layers": 2, "decoder_attention_heads": 4,
    "decoder_ffn_dim": 128, "encoder_layers": 2, "encoder_attention_heads": 4,
    "encoder_ffn_dim": 128, "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1, "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1,
    "topk_group": 1, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8, "v_head_dim": 16, "qk_head_dim": 16, "sliding_window": 8,
    "attention_window_size": 8, "state_size": 8, "ssm_state_size": 8, "mamba_d_state": 8,
    "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_head_dim": 16, "n_groups": 1,
    "time_step_rank": 8, "conv_kernel": 4, "expand": 1, "mamba_expand": 1,
    "mamba_d_ssm": 64, "mamba_dt_rank": 8, "attn_layer_indices": [1], "attn_layer_period": 2,
    "attn_layer_offset": 1, "rotary_dim": 8, "partial_rotary_factor": 0.5,
    "global_attn_every_n_layers": 2, "num_kv_heads": 2, "multi_query": True,
    "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": VOCAB, "laurel_rank": 8,
    "num_kv_shared_layers": 0, "altup_num_inputs": 2,
}

EXTRA = {"is_decoder": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
         "use_cache": True, "tie_word_embeddings": False}


def architectures():
    """(model_type, class name) for every causal LM the installed transformers maps."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())


def tiny_kwargs(config_class, depth=0):
    """Keyword arguments that make `config_class` tiny, sub-configs (text, vision, audio, ...)
    included as dicts."""
    defaults = config_class()
    stored = defaults.to_dict()
    names = set(stored) | set(getattr(config_class, "attribute_map", {}))
    kwargs = {k: v for k, v in TINY.items() if k in names}
    if "kv_lora_rank" in kwargs:  # latent attention: rope dims are the head's, no grouping
        kwargs.update({k: v for k, v in (("head_dim", TINY["qk_rope_head_dim"]),
                                         ("num_key_value_heads", TINY["num_attention_heads"]))
                       if k in names})
    kwargs.update({k: v for k, v in EXTRA.items() if k in names or (k == "is_decoder" and depth == 0)})
    # Layer-kind lists sized for the default depth would not match two layers: keep two,
    # or one layer of each kind when the first two miss a kind (hybrid models).
    for key in ("layer_types", "layers_block_type", "hybrid_override_pattern", "block_types"):
        value = stored.get(key)
        if isinstance(value, (list, tuple, str)) and len(value) > 2:
            kinds = list(dict.fromkeys(value))
            kwargs[key] = value[:2] if set(value[:2]) == set(kinds) else type(value)(kinds) if not \
                isinstance(value, str) else "".join(kinds)
            for depth_key in ("num_hidden_layers", "num_layers", "n_layer"):
                if depth_key in kwargs:
                    kwargs[depth_key] = len(kwargs[key])
    if stored.get("attention_types") is not None:  # GPT-Neo: [[kinds, repeats]] per layer
        kwargs["attention_types"] = [[["global"], kwargs.get("num_layers", 2)]]
    for key, sub_class in (getattr(config_class, "sub_configs", None) or {}).items():
        if depth < 2 and isinstance(sub_class, type) and stored.get(key) is not None:
            try:
                kwargs[key] = tiny_kwargs(sub_class, depth + 1)
            except Exception:  # a sub-config that needs arguments: keep its defaults
                pass
    return kwargs


def tiny_config(model_type):
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    return config_class(**tiny_kwargs(config_class))


def build(model_type, class_name):
    transformers = importlib.import_module("transformers")
    config = tiny_config(model_type)
    cls = getattr(transformers, class_name)
    # Counted on the meta device first: a config that stays large is not built at all.
    try:
        with torch.device("meta"):
            size = sum(p.numel() for p in cls(config).parameters())
    except Exception:  # a model whose construction reads data: count it once built
        size = 0
    if size > MAX_PARAMETERS:
        raise ValueError(f"the tiny config still has {size / 1e6:.0f}M parameters")
    torch.manual_seed(0)
    return cls(config).float().eval()


def inputs():
    ids = torch.randint(3, VOCAB, (2, 10), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0          # left padding: the mask path
    ids[0, :3] = 0
    return ids, mask


def _logits(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out[0]


def _generate(model, ids, mask, **kw):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, **kw)


def first_line(error):
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return text[0][:160] if text else type(error).__name__


def check(model_type, class_name, device="neuron"):
    """Returns (status, detail): status 'pass', 'FAIL' or 'skipped'."""
    torch._dynamo.reset()  # static-cache decoding compiles: each architecture starts afresh
    try:
        model = build(model_type, class_name)
    except Exception as error:  # the tiny config does not build this architecture
        return "skipped", "build: " + first_line(error)
    ids, mask = inputs()
    try:
        ref = _logits(model, ids, mask)
    except Exception as error:
        return "skipped", "CPU forward: " + first_line(error)
    try:
        dev = copy.deepcopy(model).to(device)
        out = _logits(dev, ids.to(device), mask.to(device))
        if out.device.type != device:
            return "FAIL", f"logits on {out.device}"
        out = out.cpu()
    except Exception as error:
        return "FAIL", "forward: " + first_line(error)
    if out.shape != ref.shape or not torch.equal(out, ref):
        diff = (out.float() - ref.float()).abs().max().item() if out.shape == ref.shape else "shape"
        return "FAIL", f"logits differ (max abs {diff})"
    notes = []
    for label, kw in (("dynamic", {}), ("static", {"cache_implementation": "static"})):
        try:
            expected = _generate(model, ids, mask, **kw)
        except Exception as error:
            notes.append(f"{label} cache n/a on CPU ({first_line(error)[:60]})")
            continue
        try:
            got = _generate(dev, ids.to(device), mask.to(device), **kw).cpu()
        except Exception as error:
            return "FAIL", f"{label} generate: " + first_line(error)
        if not torch.equal(got, expected):
            return "FAIL", f"{label} generate: tokens differ"
    return "pass", "; ".join(notes)


def release():
    """Frees what one check left behind (models, cached device blocks, compiled graphs)."""
    import gc

    gc.collect()
    if hasattr(torch, "neuron"):
        torch.neuron.synchronize()
        torch.neuron.empty_cache()
