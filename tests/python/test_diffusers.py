"""Tiny random Diffusers pipelines on `neuron` must produce CPU eager's images, bit for bit.

Two pipelines (issue 24 item 6): a UNet one (DDPM, UNet2D with attention blocks) and a
transformer one (DiT: an AdaLN-zero Transformer2D over a tiny AutoencoderKL). Each runs in
plain eager, in adaptive mode (run twice, so the denoising loop's recurring segments run
fused), and with its denoiser compiled by our torch.compile backend.

The UNet pipeline is also the layout check: its attention blocks hand channels-last
tensors to the next resnet, whose convolutions then answer channels-last on CPU; a
GroupNorm after them reduces in another order per layout, so an output whose strides
differed from CPU's showed as a 1.8e-7 drift in the image. Module outputs are compared
with their strides.
"""

import numpy as np
import pytest
import torch

import neuron_eager

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed (tools/setup.sh installs it)")


def ddpm_parts():
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8).eval()
    return {"unet": unet, "scheduler": diffusers.DDPMScheduler(num_train_timesteps=10)}


def dit_parts():
    torch.manual_seed(0)
    transformer = diffusers.Transformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
        sample_size=8, patch_size=2, num_embeds_ada_norm=1000, norm_type="ada_norm_zero",
        norm_num_groups=2).eval()
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32),
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=8, sample_size=16).eval()
    return {"transformer": transformer, "vae": vae,
            "scheduler": diffusers.DDIMScheduler(num_train_timesteps=10)}


PIPELINES = {
    "ddpm_unet": (diffusers.DDPMPipeline, ddpm_parts, "unet",
                  dict(batch_size=2, num_inference_steps=6)),
    "dit_transformer": (diffusers.DiTPipeline, dit_parts, "transformer",
                        dict(class_labels=[1, 3], num_inference_steps=4)),
}


def images(name, device, compiled=False):
    cls, parts_of, denoiser, kwargs = PIPELINES[name]
    parts = {k: (v.to(device) if isinstance(v, torch.nn.Module) else v)
             for k, v in parts_of().items()}
    if compiled:
        torch._dynamo.reset()
        parts[denoiser] = torch.compile(parts[denoiser], backend="neuron")
    pipe = cls(**parts)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(generator=torch.Generator("cpu").manual_seed(0), output_type="np", **kwargs)
    return out.images


@pytest.fixture(scope="module")
def cpu_images():
    return {name: images(name, "cpu") for name in PIPELINES}


@pytest.mark.parametrize("name", list(PIPELINES))
@pytest.mark.parametrize("mode", ["eager", "adaptive", "compiled"])
def test_pipeline_images_equal_cpu(name, mode, cpu_images):
    expected = cpu_images[name]
    if mode == "adaptive":
        neuron_eager.set_mode("adaptive")
        neuron_eager.reset_counters()
        try:
            first = images(name, "neuron")
            got = images(name, "neuron")
        finally:
            neuron_eager.set_mode("eager")
        np.testing.assert_array_equal(first, expected)
        # The second run repeats the first's op stream: recurring segments ran fused.
        assert neuron_eager.counters()["ops_in_fused_segments"] > 0
    else:
        got = images(name, "neuron", compiled=(mode == "compiled"))
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def _module_outputs(model, args):
    seen = {}

    def hook(name):
        def record(_module, _inputs, output):
            if isinstance(output, torch.Tensor):
                seen[name] = (output.detach().cpu(), output.stride())
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_unet_module_outputs_have_cpu_strides():
    unet = ddpm_parts()["unet"]
    x, t = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.tensor([5, 5])
    cpu = _module_outputs(unet, (x, t))
    dev = _module_outputs(unet.to("neuron"), (x.to("neuron"), t.to("neuron")))
    channels_last = [n for n, (v, _) in cpu.items() if v.dim() == 4 and not v.is_contiguous()]
    assert channels_last, "the model no longer produces channels-last outputs: the check is void"
    for name, (value, stride) in cpu.items():
        got, got_stride = dev[name]
        assert got_stride == stride, f"{name}: strides {got_stride} on neuron, {stride} on CPU"
        assert torch.equal(got, value), f"{name}: values differ from CPU"
