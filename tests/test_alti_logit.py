"""ALTI-logit: completeness against the model's own logits, the definition, contrast, causality and padding."""

import pytest
import torch

from inseq_mixing.methods.alti import alti, alti_rollouts
from inseq_mixing.methods.alti_logit import alti_logit
from inseq_mixing.methods.readout import UNATTRIBUTED_TERMS, sweep_logit, unembedding_direction
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import tiny_model

from .conftest import example_kwargs, get_tiny, next_tokens, trace_of
from .reference import naive_alti_logit_pre_ln


def total(scores) -> torch.Tensor:
    parts = scores.target.sum(-1) + sum(scores.unattributed.values())
    return parts if scores.source is None else parts + scores.source.sum(-1)


def assert_complete(scores, tolerance: float) -> None:
    scale = scores.logit.abs().amax(-1, keepdim=True).clamp(min=1e-3)
    assert ((total(scores) - scores.logit).abs() / scale).max() <= tolerance


def test_scores_and_unattributed_terms_add_up_to_the_logit(family):
    kwargs = example_kwargs(family, batch=2)
    scores = alti_logit(trace_of(get_tiny(family), kwargs), next_tokens(kwargs))
    assert set(scores.unattributed) == set(UNATTRIBUTED_TERMS)
    assert_complete(scores, 1e-4)
    assert scores.target.abs().sum() > 0 and (scores.source is None or scores.source.abs().sum() > 0)


@pytest.mark.parametrize("family", ["marian", "mbart", "t5_gated", "gpt2"])
def test_completeness_is_tighter_in_float64(family):
    """Llama-style RMSNorms round their output through float32 even in a float64 model, so they are left out."""
    kwargs = example_kwargs(family)
    scores = alti_logit(trace_of(tiny_model(family).double(), kwargs), next_tokens(kwargs))
    assert_complete(scores, 1e-10)


@pytest.mark.parametrize("family", ["mbart", "m2m_100", "t5", "t5_gated", "gpt2", "llama", "qwen2"])
def test_matches_the_definition_on_pre_ln_models(family):
    model = get_tiny(family)
    kwargs = example_kwargs(family)
    trace = trace_of(model, kwargs)
    ids = next_tokens(kwargs)
    scores = alti_logit(trace, ids)
    rollouts = alti_rollouts(alti(trace))
    target, source = naive_alti_logit_pre_ln(model, get_spec(model), trace, kwargs, rollouts, ids)
    torch.testing.assert_close(scores.target[0], target, atol=1e-5, rtol=1e-4)
    if source is not None:
        torch.testing.assert_close(scores.source[0], source, atol=1e-5, rtol=1e-4)


def test_contrast_explains_the_logit_difference(family):
    kwargs = example_kwargs(family)
    trace = trace_of(get_tiny(family), kwargs)
    ids = next_tokens(kwargs)
    foils = (ids + 7) % 60 + 4
    contrast, plain, foil = alti_logit(trace, ids, foils), alti_logit(trace, ids), alti_logit(trace, foils)
    assert_complete(contrast, 1e-4)
    torch.testing.assert_close(contrast.logit, plain.logit - foil.logit)
    torch.testing.assert_close(contrast.target, plain.target - foil.target, atol=1e-5, rtol=1e-4)
    if contrast.source is not None:
        torch.testing.assert_close(contrast.source, plain.source - foil.source, atol=1e-5, rtol=1e-4)


def test_future_tokens_get_exactly_zero(family):
    kwargs = example_kwargs(family, batch=2)
    scores = alti_logit(trace_of(get_tiny(family), kwargs), next_tokens(kwargs))
    assert (scores.target.triu(1) == 0).all()
    assert (scores.target.diagonal(dim1=-2, dim2=-1) != 0).all()


def test_per_head_parts_add_up_to_each_layers_part_and_to_the_scores(family):
    """Per-head ALTI-logit: each layer's heads add up to its attention part, and the head scores (plus the direct
    term) to the token scores."""
    model = get_tiny(family)
    kwargs = example_kwargs(family)
    trace, ids = trace_of(model, kwargs), next_tokens(kwargs)
    direction = unembedding_direction(trace.spec, ids, None)
    whole, heads = sweep_logit(trace, direction), sweep_logit(trace, direction, per_head=True)
    pairs = zip(whole.self_parts + whole.cross_parts, heads.self_parts + heads.cross_parts, strict=True)
    for layer_whole, layer_heads in pairs:
        assert layer_heads.shape[1] == trace.spec.decoder.layers[0].self_attn.num_heads
        torch.testing.assert_close(layer_heads.sum(1), layer_whole, atol=1e-5, rtol=1e-5)
    scores = alti_logit(trace, ids, per_head=True)
    plain = alti_logit(trace, ids)
    torch.testing.assert_close(scores.target, plain.target, atol=1e-5, rtol=1e-5)
    rebuilt = torch.diag_embed(scores.direct) + scores.target_heads.sum((1, 2))
    torch.testing.assert_close(rebuilt, plain.target, atol=1e-5, rtol=1e-5)
    if plain.source is not None:
        torch.testing.assert_close(scores.source_heads.sum((1, 2, 3)), plain.source, atol=1e-5, rtol=1e-5)


def test_the_last_layers_map_is_not_computed_and_not_needed(family):
    """A layer's parts are traced back through the maps of the layers below it: the method computes the maps of all
    but the last decoder layer, with fewer FLOPs and the scores of the whole set of maps."""
    from torch.utils.flop_counter import FlopCounterMode

    kwargs = example_kwargs(family, batch=2)
    trace, ids = trace_of(get_tiny(family), kwargs), next_tokens(kwargs)
    with FlopCounterMode(display=False) as below_last:
        scores = alti_logit(trace, ids)
    with FlopCounterMode(display=False) as every_layer:
        whole = alti_logit(trace, ids, scores=alti(trace, encoder_scores=True))
    assert below_last.get_total_flops() < every_layer.get_total_flops()
    for name in ("target", "source"):
        if getattr(whole, name) is not None:
            torch.testing.assert_close(getattr(scores, name), getattr(whole, name), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "marian"])
def test_rows_before_the_first_explained_one_are_skipped_and_the_others_unchanged(family):
    """With ``first_row``, the logit directions and parts of earlier rows (a prompt's) are not computed: those rows
    and terms are 0, every later one is what the whole computation gives (per head too), in a padded batch."""
    from torch.utils.flop_counter import FlopCounterMode

    from .conftest import padded_case

    case = padded_case(get_tiny(family), family)
    trace, ids = case.batched, case.next_ids()
    first = 3
    with FlopCounterMode(display=False) as every_row:
        whole = alti_logit(trace, ids, per_head=True)
    with FlopCounterMode(display=False) as later_rows:
        later = alti_logit(trace, ids, per_head=True, first_row=first)
    assert later_rows.get_total_flops() < every_row.get_total_flops()
    pairs = [(later.target, whole.target, -2), (later.direct, whole.direct, -1)]
    pairs += [(later.unattributed[name], whole.unattributed[name], -1) for name in UNATTRIBUTED_TERMS]
    pairs += [(later.target_heads, whole.target_heads, -2)]
    if whole.source is not None:
        pairs += [(later.source, whole.source, -2), (later.source_heads, whole.source_heads, -2)]
    for mine, theirs, axis in pairs:
        kept = [slice(None)] * mine.dim()
        kept[axis] = slice(first, None)
        torch.testing.assert_close(mine[tuple(kept)], theirs[tuple(kept)], rtol=1e-5, atol=1e-6)
        skipped = list(kept)
        skipped[axis] = slice(0, first)
        assert (mine[tuple(skipped)] == 0).all()
    torch.testing.assert_close(later.logit, whole.logit)
