"""Layouts as data: sliding-window layers give exactly zero outside the window in every method, and the supported
families come from the spec files."""

import pytest
import torch

from inseq_mixing.methods.alti import alti
from inseq_mixing.methods.decompx import DecompXOptions, decompx
from inseq_mixing.methods.readout import sweep_logit, unembedding_direction
from inseq_mixing.methods.value_zeroing import value_zeroing
from inseq_mixing.specs import SPEC_MODULES, SUPPORTED_FAMILIES, get_spec, supported_model_types
from inseq_mixing.testing import ALL_FAMILIES, TINY_SLIDING_WINDOW

from .conftest import example_kwargs, get_tiny, next_tokens, trace_of


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_sliding_window_layers_give_exactly_zero_outside_the_window(family):
    """On sliding-window layers, a query gets nothing from keys at distance >= window in every method's per-layer
    view; full-attention layers do mix those keys (so the check can fail)."""
    model = get_tiny(family)
    kwargs = example_kwargs(family)
    trace = trace_of(model, kwargs)
    num_positions = kwargs["input_ids"].shape[1]
    assert num_positions > TINY_SLIDING_WINDOW + 1
    outside = torch.ones(num_positions, num_positions).tril(diagonal=-TINY_SLIDING_WINDOW).bool()
    ids = next_tokens(kwargs)
    vz = value_zeroing(trace).decoder[0]
    maps = alti(trace).decoder[0]
    deltas = sweep_logit(trace, unembedding_direction(trace.spec, ids, None)).self_parts
    components = decompx(trace, ids, options=DecompXOptions(bias="absdot"), keep_layers=True).layers["decoder"]
    layer_types = model.config.layer_types
    assert "sliding_attention" in layer_types and "full_attention" in layer_types
    for idx, layer_type in enumerate(layer_types):
        probs = trace.decoder.layers[idx].self_attn.probs[0]
        per_token = components[idx].parts[0, :, :num_positions].abs().sum(-1)
        views = {"probs": probs.sum(0), "value_zeroing": vz[idx], "alti": maps[idx], "alti_logit": deltas[idx][0]}
        if idx == 0:  # DecompX components carry everything below: only the first layer is windowed alone
            views["decompx"] = per_token
        for name, view in views.items():
            if layer_type == "sliding_attention":
                assert (view[outside] == 0).all(), (name, idx)
            else:
                assert (view[outside] != 0).any(), (name, idx)


def test_supported_families_come_from_the_spec_files():
    """Every spec module declares its family and model types, each model type has one module, and every tiny family
    is covered by one."""
    model_types = [model_type for module in SPEC_MODULES for model_type in module.MODEL_TYPES]
    assert len(model_types) == len(set(model_types)) == len(supported_model_types())
    assert set(SUPPORTED_FAMILIES) == {module.FAMILY for module in SPEC_MODULES}
    for module in SPEC_MODULES:
        assert module.__doc__ and callable(module.build), module.__name__
    for family in ALL_FAMILIES:
        assert get_tiny(family).config.model_type in model_types
        assert get_spec(get_tiny(family)).decoder.layers
