"""Naive implementations of the definitions, on the real Hugging Face modules, to test the fast math against."""

import torch
import torch.nn.functional as F

from inseq_mixing.specs import ModelSpec


def capture_layer_calls(model, spec: ModelSpec, model_kwargs: dict) -> dict:
    """Run the model once and keep each layer's call ``(args, kwargs)`` and output, keyed by (stack, layer index)."""
    calls, handles = {}, []
    stacks = {"decoder": spec.decoder, "encoder": spec.encoder}
    for name, stack in stacks.items():
        if stack is None:
            continue
        for idx, layer in enumerate(stack.layers):

            def hook(module, args, kwargs, key=(name, idx)):
                calls[key] = (args, kwargs)

            handles.append(layer.module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**model_kwargs, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def run_layer(layer_module, call) -> torch.Tensor:
    args, kwargs = call
    with torch.no_grad():
        output = layer_module(*args, **kwargs)
    return output[0] if isinstance(output, tuple) else output


def naive_value_zeroing(model, spec: ModelSpec, model_kwargs: dict, stack: str, sub_block: str, metric="cosine"):
    """For every layer and token j: zero v_j through a hook on the value projection, re-run the layer on its clean
    input, and measure the distance to the clean layer output. Returns ``(layers, positions, tokens)`` for batch 0."""
    calls = capture_layer_calls(model, spec, model_kwargs)
    layers = (spec.decoder if stack == "decoder" else spec.encoder).layers
    per_layer = []
    for idx, layer in enumerate(layers):
        attn = layer.self_attn if sub_block == "self" else layer.cross_attn
        clean = run_layer(layer.module, calls[(stack, idx)])
        num_keys = model_kwargs["input_ids"].shape[1] if sub_block == "cross" or stack == "encoder" else None
        num_keys = num_keys or clean.shape[1]
        columns = []
        for j in range(num_keys):

            def zero_value(module, args, output, j=j, columns=attn.value_slice):
                output = output.clone()
                output[:, j, columns] = 0
                return output

            handle = attn.value_proj.register_forward_hook(zero_value)
            try:
                corrupted = run_layer(layer.module, calls[(stack, idx)])
            finally:
                handle.remove()
            if metric == "cosine":
                columns.append(1 - F.cosine_similarity(corrupted[0], clean[0], dim=-1))
            else:
                columns.append((corrupted[0] - clean[0]).norm(dim=-1))
        per_layer.append(torch.stack(columns, dim=-1))
    return torch.stack(per_layer)
