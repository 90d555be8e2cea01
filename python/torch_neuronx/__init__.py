"""`torch_neuronx` compatibility module of neuron-eager: the name Hugging Face looks for.

transformers (`is_torch_neuron_available`) and accelerate (`is_neuron_available`) pick the
`neuron` device only when `importlib.util.find_spec("torch_neuronx")` finds a package; then
they use `torch.neuron`, the "neuron" distributed backend, `NEURON_RT_VISIBLE_CORES` and
the "neuron" torch.compile backend, all of which neuron-eager provides. Shipping this
module lets Trainer and accelerate run unchanged, without patching either library.

It is exclusive with AWS's real `torch_neuronx` (both install a top-level package of this
name: install one or the other in an environment). It offers only what neuron-eager is:
importing it registers the `neuron` device (as `import torch` already does through the
backend autoload entry point); none of the real package's tracing APIs exist here.
"""

import torch  # noqa: F401  (autoloads the backend unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)

import neuron_eager  # noqa: F401  (registers `neuron` when autoloading is off)

__version__ = "0.0.0+neuron_eager"
IS_NEURON_EAGER = True  # tells this module apart from AWS's torch_neuronx
