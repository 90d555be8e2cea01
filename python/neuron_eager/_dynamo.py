"""`torch.compile(..., backend="neuron")`: the graph Dynamo captured runs op by op through
the engine (fused in adaptive mode like any other op stream). Registered through the
`torch_dynamo_backends` entry point, so nothing is imported until a user asks for it;
libraries that compile for a device named "neuron" (transformers' static-cache decoding)
then work unchanged."""


def neuron_backend(gm, example_inputs):  # noqa: ARG001 - Dynamo's backend signature
    return gm.forward
