"""Value zeroing: agreement with the naive definition, masks, normalisation, padding and chunking."""

import pytest
import torch

from inseq_mixing.methods.rollout import normalize_rows
from inseq_mixing.methods.value_zeroing import value_zeroing, value_zeroing_maps
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import is_seq2seq, tiny_model
from inseq_mixing.trace import trace_model

from .conftest import example_kwargs, get_tiny, trace_of
from .reference import naive_value_zeroing


def valid_mask(num_queries: int, num_keys: int, causal: bool) -> torch.Tensor:
    mask = torch.ones(num_queries, num_keys, dtype=torch.bool)
    return mask.tril() if causal else mask


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_matches_naive_definition(family, metric):
    model = get_tiny(family)
    kwargs = example_kwargs(family)
    scores = value_zeroing(trace_of(model, kwargs), metric=metric)
    spec = get_spec(model)
    maps = [("decoder", "self", scores.decoder, True)]
    if is_seq2seq(family):
        maps += [("decoder", "cross", scores.cross, False), ("encoder", "self", scores.encoder, False)]
    for stack, sub_block, fast, causal in maps:
        naive = naive_value_zeroing(model, spec, kwargs, stack, sub_block, metric)
        assert fast.shape[1:] == naive.shape
        valid = valid_mask(*naive.shape[1:], causal)
        assert (fast[0][:, valid] - naive[:, valid]).abs().max() <= 1e-5, (stack, sub_block)
        assert (fast[0][:, ~valid] == 0).all()
        assert fast[0][:, valid].abs().sum() > 0


def test_rows_sum_to_one(family):
    model = get_tiny(family)
    scores = value_zeroing(trace_of(model, example_kwargs(family)))
    maps = value_zeroing_maps(scores)
    for block in (maps.target, maps.source, maps.encoder):
        if block is not None:
            torch.testing.assert_close(block.sum(-1), torch.ones(block.shape[:-1]))
            assert (block >= 0).all()
    if is_seq2seq(family):
        joint = value_zeroing_maps(scores, normalization="joint")
        torch.testing.assert_close(joint.source.sum(-1) + joint.target.sum(-1), torch.ones(joint.target.shape[:-1]))


def test_rollout_rows_sum_to_one(family):
    model = get_tiny(family)
    maps = value_zeroing_maps(value_zeroing(trace_of(model, example_kwargs(family))), rollout=True)
    total = maps.target.sum(-1) + (maps.source.sum(-1) if maps.source is not None else 0)
    torch.testing.assert_close(total, torch.ones_like(total))
    assert maps.target.ndim == 3
    assert (maps.target.triu(1) == 0).all()


def test_rollout_is_product_of_layer_maps(decoder_family):
    model = get_tiny(decoder_family)
    scores = value_zeroing(trace_of(model, example_kwargs(decoder_family)))
    layers = normalize_rows(scores.decoder)[0]
    expected = layers[1] @ layers[0]
    torch.testing.assert_close(value_zeroing_maps(scores, rollout=True).target[0], expected)


def test_chunking_does_not_change_scores(family):
    model = get_tiny(family)
    trace = trace_of(model, example_kwargs(family))
    whole, chunked = value_zeroing(trace), value_zeroing(trace, max_chunk_elements=1)
    for name in ("decoder", "cross", "encoder"):
        if getattr(whole, name) is not None:
            torch.testing.assert_close(getattr(whole, name), getattr(chunked, name), rtol=0, atol=1e-6)


def test_unknown_metric_is_refused():
    model = get_tiny("gpt2")
    with pytest.raises(ValueError, match="cosine"):
        value_zeroing(trace_model(model, torch.tensor([[5, 6, 7]])), metric="manhattan")


@pytest.mark.parametrize("family", ["marian", "llama"])
def test_half_precision_runs_and_stays_close(family):
    kwargs = example_kwargs(family)
    full = value_zeroing_maps(value_zeroing(trace_of(get_tiny(family), kwargs))).target
    half_model = tiny_model(family).to(torch.bfloat16)
    half = value_zeroing_maps(value_zeroing(trace_of(half_model, kwargs))).target
    assert half.dtype == torch.float32 and torch.isfinite(half).all()
    assert (half - full).abs().max() < 0.1


def test_non_finite_scores_are_refused():
    model = get_tiny("gpt2")
    trace = trace_of(model, example_kwargs("gpt2"))
    trace.decoder.layers[0].self_attn.values[0, 0, 0, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="float32"):
        value_zeroing(trace)


@pytest.mark.parametrize("family", ["gpt2", "marian", "gemma2"])
def test_rows_nobody_reads_are_skipped_and_the_rest_unchanged(family, monkeypatch):
    """``first_row``: decoder rows before it are not computed (fewer rows go through the rest of the block) and are 0;
    every later row, chunked or not, is what the full computation gives."""
    import inseq_mixing.methods.value_zeroing as vz

    model = get_tiny(family)
    trace = trace_of(model, example_kwargs(family))
    rows_run = []
    finish = vz.finish_layer

    def counting(layer, record, sub_block, residual, *args, **kwargs):
        rows_run.append(residual.shape[0] * residual.shape[1])
        return finish(layer, record, sub_block, residual, *args, **kwargs)

    monkeypatch.setattr(vz, "finish_layer", counting)
    full = value_zeroing(trace)
    all_rows = sum(rows_run)
    first = trace.decoder.mask.shape[1] // 2
    for chunk in (2**22, 300):
        rows_run.clear()
        skipped = value_zeroing(trace, first_row=first, max_chunk_elements=chunk)
        assert sum(rows_run) < all_rows
        for name in ("decoder", "cross"):
            part, whole = getattr(skipped, name), getattr(full, name)
            if whole is None:
                continue
            assert (part[:, :, :first] == 0).all()
            torch.testing.assert_close(part[:, :, first:], whole[:, :, first:], rtol=1e-6, atol=1e-7)
        if full.encoder is not None:
            torch.testing.assert_close(skipped.encoder, full.encoder, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("final_norms", [False, True])
def test_the_layers_mean_summed_a_layer_at_a_time_is_the_mean_of_the_layer_maps(decoder_family, final_norms):
    """The default read-out (the layers' mean of the row-normalised maps, summed one layer's rows at a time from the
    first explained row) equals the mean of the full per-layer maps on those rows, chunked or not; the rows before
    are 0."""
    from inseq_mixing.methods.value_zeroing import value_zeroing_layer_mean

    trace = trace_of(get_tiny(decoder_family), example_kwargs(decoder_family))
    whole = value_zeroing_maps(value_zeroing(trace, final_norms=final_norms)).layer_mean().target
    first = trace.decoder.mask.shape[1] // 2
    for chunk in (2**22, 300):
        mean = value_zeroing_layer_mean(trace, first_row=first, max_chunk_elements=chunk, final_norms=final_norms)
        assert mean.target.shape == whole.shape and not mean.target[:, :first].any()
        torch.testing.assert_close(mean.target[:, first:], whole[:, first:], rtol=1e-5, atol=1e-6)


def test_inseq_columns_are_the_full_maps_rows_of_the_generated_tokens():
    """Through Inseq the prompt's rows are skipped; every generated token's column is still its row of the maps
    computed over every position."""
    from inseq_mixing.testing import load_tiny

    model = load_tiny("gpt2", "value_zeroing")
    prompt, text = "the cat sat", "the cat sat on the mat"
    sequence = model.attribute(prompt, text, show_progress=False, per_layer=True).sequence_attributions[0]
    ids = torch.tensor([[token.id for token in sequence.target]])
    maps = value_zeroing_maps(value_zeroing(trace_model(model.model, ids[:, :-1]))).target[0]  # (L, T, T)
    first = len(prompt.split())
    scores = sequence.target_attributions  # (tokens j, generated g, layers)
    assert scores.shape[1] == ids.shape[1] - first
    for generated in range(scores.shape[1]):
        position = first - 1 + generated
        torch.testing.assert_close(scores[: position + 1, generated].T, maps[:, position, : position + 1])


@pytest.mark.parametrize("family", ["gpt2", "t5_gated"])
def test_gelu_new_runs_as_one_fused_kernel_with_the_same_scores(family, monkeypatch):
    """The corrupted rows' ``gelu_new`` runs as torch's fused tanh GELU (counted) and gives the scores of the
    model's own Python activation; the activation modules are as they were afterwards."""
    import contextlib

    import inseq_mixing.methods.blocks as blocks
    import inseq_mixing.methods.value_zeroing as vz

    model = get_tiny(family)
    trace = trace_of(model, example_kwargs(family, batch=2))
    calls = []
    fused = blocks.fused_gelu
    monkeypatch.setattr(blocks, "fused_gelu", lambda x: calls.append(x.shape) or fused(x))
    fast = value_zeroing(trace)
    assert len(calls) >= len(trace.spec.decoder.layers)
    assert not any("forward" in module.__dict__ for module in model.modules())  # each module's own forward again
    monkeypatch.setattr(vz, "fused_activations", lambda spec: contextlib.nullcontext())
    own = value_zeroing(trace)
    for name in ("decoder", "cross", "encoder"):
        if getattr(own, name) is not None:
            torch.testing.assert_close(getattr(fast, name), getattr(own, name), rtol=1e-5, atol=1e-6)


def test_fused_activations_put_the_modules_back_after_an_error():
    from inseq_mixing.methods.blocks import fused_activations

    model = get_tiny("gpt2")
    spec = get_spec(model)
    act = spec.decoder.layers[0].ffn.activation
    with pytest.raises(RuntimeError, match="inside"), fused_activations(spec):
        assert "forward" in act.__dict__
        raise RuntimeError("inside")
    assert "forward" not in act.__dict__
