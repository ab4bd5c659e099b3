"""ALTI and ALTI+: agreement with a pair-by-pair computation, rows, causality, padding, chunking, rollouts."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inseq_mixing.methods import chunking, parts
from inseq_mixing.methods.alti import alti, alti_maps, joint_layer_blocks
from inseq_mixing.methods.chunking import (
    CAUSAL_CHUNK_SHARE,
    CPU_TILE_ELEMENTS,
    NARROWED_ELEMENTS,
    causal_chunk_slices,
    chunk_slices,
    pair_tiles,
)
from inseq_mixing.methods.norm_based import attention_norm, globenc
from inseq_mixing.methods.rollout import encoder_decoder_rollout
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import is_seq2seq, tiny_model

from .conftest import example_kwargs, get_tiny, trace_of
from .reference import naive_alti_layer


def assert_matches_pair_by_pair_computation(family: str, per_head: bool = False) -> None:
    model = get_tiny(family)
    kwargs = example_kwargs(family)
    trace = trace_of(model, kwargs)
    scores = alti(trace, per_head=per_head)
    spec = get_spec(model)
    maps = [("decoder", "self", scores.decoder)]
    if is_seq2seq(family):
        maps += [("decoder", "cross", scores.cross), ("encoder", "self", scores.encoder)]
    for stack, sub_block, fast in maps:
        for idx in range(fast.shape[1]):
            naive = naive_alti_layer(model, spec, trace, kwargs, stack, idx, sub_block, per_head)
            torch.testing.assert_close(fast[0, idx], naive, atol=1e-5, rtol=1e-4, msg=f"{stack} {sub_block} {idx}")


def test_matches_pair_by_pair_computation(family):
    assert_matches_pair_by_pair_computation(family)


def test_layer_maps_are_non_negative_rows_summing_to_one(family):
    scores = alti(trace_of(get_tiny(family), example_kwargs(family, batch=2)))
    for block in (scores.decoder, scores.cross, scores.encoder):
        if block is not None:
            assert (block >= 0).all()
            torch.testing.assert_close(block.sum(-1), torch.ones(block.shape[:-1]))
    assert (scores.decoder.triu(1) == 0).all()
    if scores.cross is not None:
        source, target = joint_layer_blocks(scores)
        torch.testing.assert_close(source.sum(-1) + target.sum(-1), torch.ones(target.shape[:-1]))


def test_rollout_rows_sum_to_one_and_stay_causal(family):
    maps = alti_maps(alti(trace_of(get_tiny(family), example_kwargs(family, batch=2))))
    total = maps.target.sum(-1) + (maps.source.sum(-1) if maps.source is not None else 0)
    torch.testing.assert_close(total, torch.ones_like(total))
    assert maps.target.ndim == 3 and (maps.target.triu(1) == 0).all() and (maps.target >= 0).all()
    if maps.encoder is not None:
        torch.testing.assert_close(maps.encoder.sum(-1), torch.ones(maps.encoder.shape[:-1]))


def test_rollout_follows_the_definition(seq2seq_family):
    """ALTI+: R^0 = [C_x R_enc, C_y], R^l = rownorm([C_x R_enc + C_y R_x, C_y R_y]), checked for two layers."""
    scores = alti(trace_of(get_tiny(seq2seq_family), example_kwargs(seq2seq_family)))
    encoder = scores.encoder[0, 1] @ scores.encoder[0, 0]
    source, target = (block[0] for block in joint_layer_blocks(scores))
    first_x, first_y = source[0] @ encoder, target[0]
    second = torch.cat([source[1] @ encoder + target[1] @ first_x, target[1] @ first_y], dim=-1)
    second = second / second.sum(-1, keepdim=True)
    maps = alti_maps(scores)
    torch.testing.assert_close(maps.encoder[0], encoder)
    torch.testing.assert_close(torch.cat([maps.source[0], maps.target[0]], -1), second)
    rolled_source, _ = encoder_decoder_rollout(encoder[None], source[None], target[None])
    torch.testing.assert_close(rolled_source[0, 0], first_x)


def test_chunking_does_not_change_maps(family):
    trace = trace_of(get_tiny(family), example_kwargs(family, batch=2))
    whole, chunked = alti(trace), alti(trace, max_chunk_elements=1)
    for name in ("decoder", "cross", "encoder"):
        if getattr(whole, name) is not None:
            torch.testing.assert_close(getattr(whole, name), getattr(chunked, name), rtol=0, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 2**19),
    st.sampled_from([1, 2**16, 2**22]),
    st.sampled_from([None, 0]),
    st.integers(1, 6),
)
def test_causal_chunks_cover_the_triangle_with_little_waste(num_items, per_item, bound, smallest, fewest):
    # on an accelerator a layer's chunks stay as wide as the memory bound allows (fewer kernels)
    assert causal_chunk_slices(num_items, per_item, bound, smallest, fewest, "cuda") == chunk_slices(
        num_items, per_item, bound
    )
    chunks = causal_chunk_slices(num_items, per_item, bound, smallest, fewest)
    assert [item for chunk in chunks for item in range(chunk.start, chunk.stop)] == list(range(num_items))
    widths = [chunk.stop - chunk.start for chunk in chunks]
    assert max(widths) <= max(1, bound // per_item)  # the memory bound holds
    narrowed = max(-(-num_items // CAUSAL_CHUNK_SHARE), fewest)
    if smallest is not None or per_item * narrowed >= NARROWED_ELEMENTS:  # narrowed: the waste is ~n²/16 at most
        wasted = sum(width * (width - 1) // 2 for width in widths)
        assert wasted <= num_items * (max(narrowed, 1) - 1) / 2


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 90),
    st.integers(1, 90),
    st.integers(1, 2**12),
    st.sampled_from([1, 2**10, 2**16, 2**22]),
    st.booleans(),
    st.sampled_from(["cpu", "cuda"]),
)
def test_pair_tiles_cover_every_needed_pair_once_within_the_bound(queries, keys, per_pair, bound, causal, device):
    covered = torch.zeros(queries, keys, dtype=torch.int)
    for rows, columns in pair_tiles(queries, keys, per_pair, bound, device, causal):
        covered[rows, columns] += 1
        pairs = (rows.stop - rows.start) * (columns.stop - columns.start)
        assert pairs * per_pair <= max(bound, per_pair)  # the memory bound holds (a tile has at least one pair)
        if device == "cpu":
            assert pairs * per_pair <= max(CPU_TILE_ELEMENTS, per_pair)  # cache-sized on a CPU
        elif keys * per_pair <= bound:  # elsewhere whole key rows, where the bound allows them
            assert columns == slice(0, min(keys, rows.stop) if causal else keys)
        if causal:
            assert columns.start < rows.stop  # no tile lies wholly in the future
    needed = torch.ones(queries, keys, dtype=torch.bool)
    if causal:
        needed = needed.tril()
    assert (covered[needed] == 1).all() and (covered <= 1).all()


@pytest.mark.parametrize("family", ["marian", "gpt2", "gemma2", "opt_post_ln"])
@pytest.mark.parametrize("method", ["alti", "alti_per_head", "globenc", "attention_norm"])
def test_cache_tiles_do_not_change_maps(family, method, monkeypatch):
    """Tiles of a few keys and many positions, whose edges cross the diagonal and the causal edge inside a tile, give
    the maps of one tile per sub-block (counted: the small tiles really were used)."""
    compute = {
        "alti": alti,
        "alti_per_head": lambda trace: alti(trace, per_head=True),
        "globenc": lambda trace: globenc(trace, rollout=False),
        "attention_norm": lambda trace: attention_norm(trace, residual=True, layer_norm=True),
    }[method]
    trace = trace_of(get_tiny(family), example_kwargs(family, batch=2))
    monkeypatch.setattr(chunking, "CPU_TILE_ELEMENTS", 2**40)
    monkeypatch.setattr(chunking, "CPU_TILE_KEYS", 10**6)
    whole = compute(trace)
    monkeypatch.setattr(chunking, "CPU_TILE_KEYS", 2)
    counted = []

    def counting(*args, **kwargs):
        counted.append(tiles := chunking.pair_tiles(*args, **kwargs))
        return tiles

    monkeypatch.setattr(parts, "pair_tiles", counting)
    tiled = compute(trace)
    assert max(len(tiles) for tiles in counted) >= 3
    names = [
        name for name in ("decoder", "cross", "encoder", "target", "source") if getattr(whole, name, None) is not None
    ]
    for name in names:
        torch.testing.assert_close(getattr(tiled, name), getattr(whole, name), rtol=0, atol=1e-6)
    assert getattr(whole, names[0]).abs().sum() > 0


def test_narrowed_causal_chunks_do_not_change_maps(monkeypatch):
    """ALTI's causal chunks narrowed to a few positions (as on full-size batches) give the maps of one whole chunk."""
    trace = trace_of(get_tiny("gpt2"), example_kwargs("gpt2", batch=2))
    whole = alti(trace)
    monkeypatch.setattr(chunking, "NARROWED_ELEMENTS", 0)
    monkeypatch.setattr(chunking, "CAUSAL_CHUNK_SHARE", 3)
    narrowed = alti(trace)
    torch.testing.assert_close(narrowed.decoder, whole.decoder, rtol=0, atol=1e-6)
    assert not torch.equal(narrowed.decoder, torch.zeros_like(narrowed.decoder))


@pytest.mark.parametrize("family", ["bart", "qwen2"])
def test_half_precision_runs_and_stays_close(family):
    kwargs = example_kwargs(family)
    full = alti_maps(alti(trace_of(get_tiny(family), kwargs))).target
    half = alti_maps(alti(trace_of(tiny_model(family).to(torch.bfloat16), kwargs))).target
    assert half.dtype == torch.float32 and torch.isfinite(half).all()
    assert (half - full).abs().max() < 0.1


def test_non_finite_maps_are_refused():
    trace = trace_of(get_tiny("llama"), example_kwargs("llama"))
    trace.decoder.layers[1].self_attn.values[0, 2, 0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="float32"):
        alti(trace)


@pytest.mark.parametrize("family", ["marian", "t5", "gpt2", "llama", "gemma2", "olmo2", "opt_post_ln"])
def test_per_head_maps_match_pair_by_pair_computation(family):
    """Per-head ALTI (our extension): one part per head and token, the residual a part of its own, each row
    normalised over all of them; checked against the HF modules head by head."""
    assert_matches_pair_by_pair_computation(family, per_head=True)


def test_per_head_rows_sum_to_one_with_the_residual_in_its_own_slot(family):
    trace = trace_of(get_tiny(family), example_kwargs(family, batch=2))
    scores = alti(trace, per_head=True)
    heads = get_spec(get_tiny(family)).decoder.layers[0].self_attn.num_heads
    for block, self_mixing in ((scores.decoder, True), (scores.cross, False), (scores.encoder, True)):
        if block is None:
            continue
        assert block.shape[2] == heads + 1 and (block >= 0).all()
        torch.testing.assert_close(block.sum((2, 4)), torch.ones(block.shape[:2] + block.shape[3:4]))
        residual = block[:, :, -1]
        off = residual - (torch.diag_embed(residual.diagonal(dim1=-2, dim2=-1)) if self_mixing else 0)
        if not self_mixing:
            off = residual[..., :-1]
        assert (off == 0).all()
    assert (scores.decoder.triu(1) == 0).all()
    if scores.cross is not None:
        source, target = joint_layer_blocks(scores)
        total = source.sum((2, 4)) + target.sum((2, 4))
        torch.testing.assert_close(total, torch.ones_like(total))
    with pytest.raises(ValueError, match="per_layer=True"):
        alti_maps(scores)


def test_per_head_chunks_do_not_change_the_maps():
    trace = trace_of(get_tiny("marian"), example_kwargs("marian", batch=2))
    whole, chunked = alti(trace, per_head=True), alti(trace, per_head=True, max_chunk_elements=1)
    for name in ("decoder", "cross", "encoder"):
        torch.testing.assert_close(getattr(chunked, name), getattr(whole, name))
