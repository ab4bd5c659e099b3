"""Invariants every plugin method inherits, through Inseq, over the table of registered methods: a padded batch (the
dataset runner's batched path) gives each sentence what it gets alone, future tokens never change past columns,
half precision runs, NaN weights are refused with a clear error, and a failed call leaves the model as it was."""

import pytest
import torch

import inseq_mixing
from inseq_mixing.runs.runner import attribute_texts, split_arguments
from inseq_mixing.testing import is_seq2seq, load_tiny

FAMILIES = ("marian", "t5", "gpt2", "llama", "gemma2", "gpt_neox", "olmo2")
SOURCES = ["the cat sat on the mat", "a dog"]
TARGETS = ["le chat assis sur le tapis", "un chien"]
PROMPTS = ["the cat sat", "a dog"]
TEXTS = ["the cat sat on the mat", "a dog sat on a mat"]


@pytest.fixture(params=inseq_mixing.METHODS)
def method(request):
    return request.param


@pytest.fixture(params=FAMILIES)
def tiny_family(request):
    return request.param


def texts(family: str) -> tuple[list[str], list[str]]:
    return (SOURCES, TARGETS) if is_seq2seq(family) else (PROMPTS, TEXTS)


def alone(model, family: str, source: str, target: str, **kwargs):
    if is_seq2seq(family):
        return model.attribute(source, target, attribute_target=True, show_progress=False, **kwargs)
    return model.attribute(source, target, show_progress=False, **kwargs)


def test_padded_batch_equals_each_sentence_alone(method, tiny_family):
    model = load_tiny(tiny_family, method)
    sources, targets = texts(tiny_family)
    inseq_args, options = split_arguments(model, {})
    batched = attribute_texts(model, sources, targets, inseq_args, options).sequence_attributions
    for seq, source, target in zip(batched, sources, targets, strict=True):
        single = alone(model, tiny_family, source, target).sequence_attributions[0]
        torch.testing.assert_close(
            seq.target_attributions, single.target_attributions, atol=1e-5, rtol=1e-4, equal_nan=True
        )
        if single.source_attributions is not None:
            torch.testing.assert_close(seq.source_attributions, single.source_attributions, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2"])
def test_future_tokens_do_not_change_past_columns(method, family):
    model = load_tiny(family, method)
    first = alone(model, family, "the cat", "the cat sat on the mat").sequence_attributions[0]
    second = alone(model, family, "the cat", "the cat sat on the dog").sequence_attributions[0]
    columns = first.target_attributions.shape[1]
    assert first.target_attributions[-1, : columns - 1].isnan().all()  # a column never sees its own or later tokens
    torch.testing.assert_close(
        first.target_attributions[:-1, : columns - 1], second.target_attributions[:-1, : columns - 1], equal_nan=True
    )


def test_bfloat16_runs_and_is_finite(method, tiny_family):
    model = load_tiny(tiny_family, method)
    model.model.to(torch.bfloat16)
    source, target = (part[0] for part in texts(tiny_family))
    seq = alone(model, tiny_family, source, target).sequence_attributions[0]
    values = seq.target_attributions[~seq.target_attributions.isnan()]
    assert values.numel() and torch.isfinite(values).all()


def test_nan_weights_are_refused_and_the_model_is_unchanged(method, tiny_family):
    model = load_tiny(tiny_family, method)
    hf_model = model.model
    with torch.no_grad():
        next(p for name, p in hf_model.named_parameters() if p.dim() == 2 and "embed" not in name)[0, 0] = float("nan")
    state = {name: value.clone() for name, value in hf_model.state_dict().items()}
    source, target = (part[0] for part in texts(tiny_family))
    with pytest.raises((ValueError, FloatingPointError), match="(?i)nan|non-finite|finite"):
        alone(model, tiny_family, source, target)
    for name, value in hf_model.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0, equal_nan=True)
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in hf_model.modules())


def test_a_failed_call_leaves_the_model_as_it_was(method, tiny_family):
    model = load_tiny(tiny_family, method)
    hf_model = model.model
    source, target = (part[0] for part in texts(tiny_family))
    expected = alone(model, tiny_family, source, target).sequence_attributions[0].target_attributions
    implementation, training = hf_model.config._attn_implementation, hf_model.training
    blocks = inseq_mixing.get_spec(hf_model).decoder.layers

    def fail(*_):
        raise RuntimeError("provoked")

    handle = blocks[-1].module.register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="provoked"):
            alone(model, tiny_family, source, target)
    finally:
        handle.remove()
    assert hf_model.config._attn_implementation == implementation and hf_model.training == training
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in hf_model.modules())
    again = alone(model, tiny_family, source, target).sequence_attributions[0].target_attributions
    torch.testing.assert_close(again, expected, rtol=0, atol=0, equal_nan=True)
