"""DecompX: completeness at every layer and at the logit for every family and option, causality, padding, contrast,
chunking."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from inseq_mixing.methods.alti_logit import alti_logit
from inseq_mixing.methods.decompx import DecompXOptions, decompx
from inseq_mixing.methods.norms import freeze_norm
from inseq_mixing.methods.readout import sweep_logit, unembedding_direction
from inseq_mixing.testing import tiny_model

from .conftest import example_kwargs, get_tiny, next_tokens, padded_case, trace_of

OPTIONS = [
    DecompXOptions(),
    DecompXOptions(bias="norm"),
    DecompXOptions(bias="equal"),
    DecompXOptions(bias="separate"),
    DecompXOptions(ffn_linearization="tangent"),
    DecompXOptions(gated_split="gate"),
    DecompXOptions(gated_split="gate", ffn_linearization="tangent", bias="separate"),
    DecompXOptions(include_ffn=False),
    DecompXOptions(max_chunk_elements=1),
]


def logit_total(scores) -> torch.Tensor:
    total = scores.target.sum(-1)
    if scores.source is not None:
        total = total + scores.source.sum(-1)
    return total if scores.bias is None else total + scores.bias


def assert_complete(trace, scores, tolerance: float) -> None:
    """Components sum to every recorded block output (real positions) and the token scores to the logit."""
    stacks = {"decoder": trace.decoder, "encoder": trace.encoder}
    for name, layers in scores.layers.items():
        stack = stacks[name]
        for components, record in zip(layers, stack.layers, strict=True):
            real = stack.mask.bool()
            error = (components.total() - record.output)[real].abs().max()
            assert error <= tolerance * record.output[real].abs().max(), (name, float(error))
    scale = scores.logit.abs().amax(-1, keepdim=True).clamp(min=1e-3)
    assert ((logit_total(scores) - scores.logit).abs() / scale).max() <= tolerance


@pytest.mark.parametrize(
    "options",
    OPTIONS,
    ids=lambda o: f"{o.bias}-{o.ffn_linearization}-{o.gated_split}-{o.include_ffn}-{o.max_chunk_elements}",
)
def test_components_add_up_at_every_layer_and_at_the_logit(family, options):
    kwargs = example_kwargs(family, batch=2)
    trace = trace_of(get_tiny(family), kwargs)
    scores = decompx(trace, next_tokens(kwargs), options=options, keep_layers=True)
    assert len(scores.layers["decoder"]) == len(trace.decoder.layers)
    assert_complete(trace, scores, 1e-4)
    assert (scores.bias is not None) == (options.bias == "separate")
    assert scores.target.abs().sum() > 0 and (scores.source is None or scores.source.abs().sum() > 0)


@pytest.mark.parametrize("family", ["marian", "mbart", "t5_gated", "gpt2"])
def test_completeness_is_tighter_in_float64(family):
    kwargs = example_kwargs(family)
    trace = trace_of(tiny_model(family).double(), kwargs)
    assert_complete(trace, decompx(trace, next_tokens(kwargs), keep_layers=True), 1e-10)


def test_future_tokens_and_padding_get_exactly_zero_at_every_layer(family):
    case = padded_case(get_tiny(family), family)
    ids = torch.full(case.batched.decoder.mask.shape, 5)
    scores = decompx(case.batched, ids, keep_layers=True)
    offset = 0 if case.batched.encoder is None else case.batched.encoder.mask.shape[1]
    real = case.batched.decoder.mask.bool()[:, :, None]
    for components in scores.layers["decoder"]:
        carried = components.parts[:, :, offset : offset + ids.shape[1]].abs().sum(-1) * real
        assert (carried.triu(1) == 0).all()  # a real position i carries no component k > i
    assert (scores.target.triu(1) == 0).all()
    for idx, (source, _) in enumerate(case.spans):
        padding = case.outside(idx)
        assert (scores.target[idx][:, padding] == 0).all() and (scores.target[idx][padding] == 0).all()
        if scores.source is not None:
            assert (scores.source[idx][:, source.stop :] == 0).all()


def test_contrast_is_the_difference_of_two_explanations(family):
    kwargs = example_kwargs(family)
    trace = trace_of(get_tiny(family), kwargs)
    ids = next_tokens(kwargs)
    foils = (ids + 7) % 60 + 4
    options = DecompXOptions(bias="separate")  # the other splits depend on the explained direction
    contrast = decompx(trace, ids, foils, options)
    plain, foil = decompx(trace, ids, options=options), decompx(trace, foils, options=options)
    torch.testing.assert_close(contrast.logit, plain.logit - foil.logit)
    torch.testing.assert_close(contrast.target, plain.target - foil.target, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(contrast.bias, plain.bias - foil.bias, atol=1e-5, rtol=1e-4)


def test_single_token_gets_everything_but_the_bias(decoder_family):
    trace = trace_of(get_tiny(decoder_family), {"input_ids": torch.tensor([[7]])})
    scores = decompx(trace, torch.tensor([[9]]), options=DecompXOptions(bias="separate"))
    torch.testing.assert_close(scores.target[0, 0, 0] + scores.bias[0, 0], scores.logit[0, 0])


def test_non_finite_scores_are_refused():
    trace = trace_of(get_tiny("gpt2"), example_kwargs("gpt2"))
    trace.decoder.layers[0].self_attn.probs[0, 0, 3, 1] = float("inf")
    with pytest.raises(FloatingPointError, match="float32"):
        decompx(trace, next_tokens(example_kwargs("gpt2")))


@pytest.mark.parametrize("explain", [decompx, alti_logit], ids=["decompx", "alti_logit"])
@pytest.mark.parametrize("family", ["marian", "llama"])
def test_logit_methods_run_in_half_precision_and_stay_close(family, explain):
    kwargs = example_kwargs(family)
    full = explain(trace_of(get_tiny(family), kwargs), next_tokens(kwargs))
    half = explain(trace_of(tiny_model(family).to(torch.bfloat16), kwargs), next_tokens(kwargs))
    assert half.target.dtype == torch.float32 and torch.isfinite(half.target).all()
    assert (half.target - full.target).abs().max() < 0.1 * full.logit.abs().max()


@pytest.mark.parametrize("family", ["marian", "t5_gated", "gpt2", "llama"])
@pytest.mark.parametrize("bias", ["absdot", "separate"])
def test_chunked_storage_gives_the_same_scores_and_bounds_every_block(family, bias, monkeypatch):
    """Small ``max_chunk_elements``: many position blocks and component slabs, the same scores as one chunk, every
    stored block within the bound, and a causal stream stored packed (a block keeps only the tokens it can see)."""
    from inseq_mixing.methods import decompx as module

    kwargs = example_kwargs(family, batch=2)
    trace = trace_of(get_tiny(family), kwargs)
    whole = decompx(trace, next_tokens(kwargs), options=DecompXOptions(bias=bias))
    num_components = sum(stack.mask.shape[1] for stack in (trace.decoder, trace.encoder) if stack is not None) + 1
    limit = 2 * 16 * num_components * 2  # batch × d_model × components × 2 positions
    blocks_seen = []
    original = module.decompose_layer

    def spy(layer, record, stream, *args, **kw):
        blocks_seen.extend((block.rows, block.cols, block.stream.parts.numel()) for block in stream.blocks)
        return original(layer, record, stream, *args, **kw)

    monkeypatch.setattr(module, "decompose_layer", spy)
    chunked = decompx(trace, next_tokens(kwargs), options=DecompXOptions(bias=bias, max_chunk_elements=limit))
    torch.testing.assert_close(chunked.target, whole.target, atol=1e-5, rtol=1e-5)
    if whole.source is not None:
        torch.testing.assert_close(chunked.source, whole.source, atol=1e-5, rtol=1e-5)
    assert len({rows.start for rows, _, _ in blocks_seen}) > 1
    assert all(numel <= limit or rows.stop - rows.start == 1 for rows, _, numel in blocks_seen)
    if trace.encoder is None:  # decoder-only: position p keeps components 0..p (and the bias one)
        for rows, cols, _ in blocks_seen:
            assert int(cols[cols < trace.decoder.mask.shape[1]].max()) == rows.stop - 1


@pytest.mark.parametrize("bias", ["absdot", "norm"])
def test_reference_convention_is_complete_and_differs_from_the_paper(family, bias):
    """The released code's bias conventions keep completeness at every layer and at the logit, and move the scores
    where the model has attention biases."""
    model = get_tiny(family)
    kwargs = example_kwargs(family)
    trace, ids = trace_of(model, kwargs), next_tokens(kwargs)
    reference = decompx(trace, ids, options=DecompXOptions(bias=bias, convention="reference"), keep_layers=True)
    assert_complete(trace, reference, 1e-4)
    has_attention_bias = any(layer.self_attn.out_bias is not None for layer in trace.spec.decoder.layers)
    if has_attention_bias:
        paper = decompx(trace, ids, options=DecompXOptions(bias=bias))
        assert not torch.allclose(paper.target, reference.target, atol=1e-6)


def test_reference_logit_bias_split_is_by_each_components_logit_vector():
    """With a logit bias that is a multiple of the explained token's one-hot vector, a component's logit vector
    dotted with it is its score for that token: the released code's split equals the paper's; with another bias
    vector it does not."""
    model = get_tiny("llama")  # no attention biases: only the logit bias's split can differ
    kwargs = example_kwargs("llama")
    trace = trace_of(model, kwargs)
    ids = torch.full_like(kwargs["input_ids"], 9)
    vocab = trace.spec.lm_head.weight.shape[0]
    one_hot = torch.zeros(vocab)
    one_hot[9] = 2.5
    options = {mode: DecompXOptions(bias="absdot", convention=mode) for mode in ("paper", "reference")}
    with_bias = replace(trace, spec=replace(trace.spec, logits_bias=one_hot))
    paper, reference = (decompx(with_bias, ids, options=options[mode]).target for mode in ("paper", "reference"))
    torch.testing.assert_close(reference, paper, atol=1e-6, rtol=1e-5)
    other = replace(
        trace, spec=replace(trace.spec, logits_bias=torch.randn(vocab, generator=torch.Generator().manual_seed(0)))
    )
    paper, reference = (decompx(other, ids, options=options[mode]).target for mode in ("paper", "reference"))
    torch.testing.assert_close(reference.sum(-1), paper.sum(-1), atol=1e-5, rtol=1e-5)  # the same bias in total
    assert not torch.allclose(reference, paper, atol=1e-4)


def value_bias_readout(trace, ids) -> dict[str, torch.Tensor]:
    """``g_t · (Σ_j α^h_tj) (b^h_V W^h_O)`` per layer and head, ``(B, L, H, T)``: what each head's value bias adds to
    its branch along the logit direction (rows of α sum to 1, or less where a sink takes the rest), for ``"self"`` and
    ``"cross"`` attention."""
    sweep = sweep_logit(trace, unembedding_direction(trace.spec, ids, None))
    terms = {}
    for name in ("self", "cross"):
        per_layer = []
        for layer, record, branches in zip(trace.spec.decoder.layers, trace.decoder.layers, sweep.branches,
                                           strict=True):  # fmt: skip
            attn = layer.self_attn if name == "self" else layer.cross_attn
            if attn is None:
                break
            _, bias = attn.value_weight()
            heads = attn.kv_head_of_query_head()
            bias = (
                torch.zeros(attn.num_heads, attn.head_dim) if bias is None else bias.reshape(-1, attn.head_dim)[heads]
            )
            carried = torch.einsum("he,hed->hd", bias.float(), attn.out_weight_per_head().float())
            rows = (record.self_attn if name == "self" else record.cross_attn).probs.sum(-1).float()  # (B, H, T)
            per_layer.append(torch.einsum("hd,btd->bht", carried, branches[name]) * rows)
        if per_layer:
            terms[name] = torch.stack(per_layer, dim=1)
    return terms


def test_per_head_token_sums_are_alti_logits_heads_without_the_value_bias(family):
    """Both methods read a head's output along the same logit direction: summed over tokens, DecompX's per-head
    scores (value bias split off) plus the head's value-bias term equal ALTI-logit's per-head parts (value bias inside
    the values)."""
    trace = trace_of(get_tiny(family), example_kwargs(family, batch=2))
    ids = next_tokens(example_kwargs(family, batch=2))
    ours, alti_heads = decompx(trace, ids, per_head=True), alti_logit(trace, ids, per_head=True)
    bias = value_bias_readout(trace, ids)
    sums = ours.target_heads.sum(-1) + (0 if ours.source_heads is None else ours.source_heads[:, 0].sum(-1))
    expected = alti_heads.target_heads.sum(-1)
    if ours.source_heads is not None:
        expected = expected + alti_heads.source_heads[:, 0].sum(-1)
        cross = ours.source_heads[:, 1].sum(-1) + bias["cross"]
        torch.testing.assert_close(cross, alti_heads.source_heads[:, 1].sum(-1), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(sums + bias["self"], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_per_head_scores_read_each_heads_output_components(family):
    """Pre-RMSNorm, no biases (so no bias or norm-shift shares enter the values): head h's components of layer l are
    the frozen-norm values of the layer input's components, mixed by its attention and projected by its W_O, read
    along the logit direction on the branch."""
    trace = trace_of(get_tiny(family), example_kwargs(family))
    ids = next_tokens(example_kwargs(family))
    scores = decompx(trace, ids, per_head=True, keep_layers=True)
    branches = sweep_logit(trace, unembedding_direction(trace.spec, ids, None)).branches
    h0 = trace.decoder.layers[0].input.float()
    inputs = [torch.diag_embed(h0.transpose(1, 2)).permute(0, 2, 3, 1)]  # position i holds its own token
    inputs += [components.parts for components in scores.layers["decoder"][:-1]]
    for idx, (layer, record) in enumerate(zip(trace.spec.decoder.layers, trace.decoder.layers, strict=True)):
        attn = layer.self_attn
        normed = freeze_norm(attn.norm, record.input).linear(inputs[idx])
        weight, _ = attn.value_weight()
        values = (normed @ weight.float()).unflatten(-1, (attn.num_kv_heads, attn.head_dim))
        values = values[..., attn.kv_head_of_query_head(), :]  # (B, j, k, H, e)
        mixed = torch.einsum("bhtj,bjkhe->bhtke", record.self_attn.probs.float(), values)
        read = torch.einsum("bhtke,hed,btd->bhtk", mixed, attn.out_weight_per_head().float(), branches[idx]["self"])
        torch.testing.assert_close(scores.target_heads[:, idx], read, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama", "marian", "t5_gated", "gpt_neox"])
@pytest.mark.parametrize(
    "options",
    OPTIONS,
    ids=lambda o: f"{o.bias}-{o.ffn_linearization}-{o.gated_split}-{o.include_ffn}-{o.max_chunk_elements}",
)
def test_packed_causal_ffn_equals_the_blocked_one(family, options, monkeypatch):
    """A causal stream's FFN on its packed (position, component) pairs gives what the blocks of positions give, with
    fewer rows through the FFN's products, in a padded batch."""
    import inseq_mixing.methods.decompx as dx
    import inseq_mixing.methods.decompx_plan as plan

    case = padded_case(get_tiny(family), family)
    trace, ids = case.batched, case.next_ids()
    rows = []
    linear = dx.linear_parts

    def counting(module, components, mode):
        rows.append(components.parts.shape[:-1].numel())
        return linear(module, components, mode)

    monkeypatch.setattr(dx, "linear_parts", counting)
    monkeypatch.setattr(plan, "PACK_WHEN", 0.0)  # packed wherever it can be
    packed = decompx(trace, ids, options=options, keep_layers=True)
    packed_rows = sum(rows)
    rows.clear()
    monkeypatch.setattr(plan, "PACK_CAUSAL_FFN", False)
    blocked = decompx(trace, ids, options=options, keep_layers=True)
    assert packed_rows <= sum(rows)
    if options.include_ffn and options.max_chunk_elements > 1:  # one block of positions: the whole square
        assert packed_rows < sum(rows)
    for name in ("target", "source", "bias"):
        if getattr(blocked, name) is not None:
            torch.testing.assert_close(getattr(packed, name), getattr(blocked, name), rtol=1e-5, atol=1e-5)
    real = trace.decoder.mask.bool()  # padding positions hold whatever their rows compute
    for mine, theirs in zip(packed.layers["decoder"], blocked.layers["decoder"], strict=True):
        torch.testing.assert_close(mine.parts[real], theirs.parts[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama", "marian", "gemma2", "opt_post_ln"])
@pytest.mark.parametrize(
    "options",
    [DecompXOptions(), DecompXOptions(bias="separate"), DecompXOptions(max_chunk_elements=2**11)],
    ids=lambda o: f"{o.bias}-{o.max_chunk_elements}",
)
def test_causal_attention_products_on_carried_pairs_equal_dense_ones(family, options, monkeypatch):
    """A causal self-attention's value and output projections taken only on the (position, component) pairs that may
    be non-zero give what the products on every pair of each block give, with fewer rows, in a padded batch."""
    import inseq_mixing.methods.decompx_plan as plan

    case = padded_case(get_tiny(family), family)
    trace, ids = case.batched, case.next_ids()
    monkeypatch.setattr(plan, "PACK_WHEN", 0.0)  # packed wherever it can be
    with FlopCounterMode(display=False) as packed_flops:
        packed = decompx(trace, ids, options=options, per_head=True, keep_layers=True)
    monkeypatch.setattr(plan.RowBlock, "carried_pairs", lambda self, key: None)
    with FlopCounterMode(display=False) as dense_flops:
        dense = decompx(trace, ids, options=options, per_head=True, keep_layers=True)
    assert packed_flops.get_total_flops() < dense_flops.get_total_flops()  # the FFN is packed alike in both
    for name in ("target", "source", "bias", "target_heads", "source_heads"):
        if getattr(dense, name, None) is not None:
            torch.testing.assert_close(getattr(packed, name), getattr(dense, name), rtol=1e-5, atol=1e-5)
    real = trace.decoder.mask.bool()  # padding positions hold whatever their rows compute
    for mine, theirs in zip(packed.layers["decoder"], dense.layers["decoder"], strict=True):
        torch.testing.assert_close(mine.parts[real], theirs.parts[real], rtol=1e-5, atol=1e-5)


def test_narrow_blocks_of_a_causal_stream_do_not_change_the_scores(monkeypatch):
    """A causal stream stored in narrow blocks of positions (as on full-size batches) gives the scores of one block."""
    import inseq_mixing.methods.decompx as dx
    from inseq_mixing.methods import chunking

    case = padded_case(get_tiny("gpt2"), "gpt2")
    trace, ids = case.batched, case.next_ids()
    blocks = []
    initial = dx.initial_stream
    monkeypatch.setattr(dx, "initial_stream", lambda *a, **k: blocks.append(len((s := initial(*a, **k)).blocks)) or s)
    whole = decompx(trace, ids, keep_layers=True)
    monkeypatch.setattr(chunking, "NARROWED_ELEMENTS", 0)
    monkeypatch.setattr(chunking, "CAUSAL_CHUNK_SHARE", 3)
    narrow = decompx(trace, ids, keep_layers=True)
    assert blocks[0] == 1 and blocks[1] == 3
    torch.testing.assert_close(narrow.target, whole.target, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(narrow.bias, whole.bias, rtol=1e-5, atol=1e-5)


def test_the_reference_convention_keeps_its_value_bias_on_carried_pairs(monkeypatch):
    """``convention="reference"`` adds each token's value bias to its own value (the first layer): packed or not."""
    import inseq_mixing.methods.decompx_plan as plan

    case = padded_case(get_tiny("gpt2"), "gpt2")
    trace, ids = case.batched, case.next_ids()
    options = DecompXOptions(convention="reference")
    monkeypatch.setattr(plan, "PACK_WHEN", 0.0)
    packed = decompx(trace, ids, options=options)
    monkeypatch.setattr(plan.RowBlock, "carried_pairs", lambda self, key: None)
    dense = decompx(trace, ids, options=options)
    torch.testing.assert_close(packed.target, dense.target, rtol=1e-5, atol=1e-5)


def test_a_single_sentence_packs_its_causal_ffn_rows_by_default(monkeypatch):
    """One block of positions would carry the whole square of (position, component) rows: the default packs them."""
    import inseq_mixing.methods.decompx_plan as plan

    kwargs = example_kwargs("gpt2")
    trace = trace_of(get_tiny("gpt2"), kwargs)
    counted = []
    run = plan.PackedChunk.run
    monkeypatch.setattr(plan.PackedChunk, "run", lambda *args, **kw: counted.append(1) or run(*args, **kw))
    decompx(trace, next_tokens(kwargs))
    assert len(counted) == len(trace.decoder.layers)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_a_key_norms_shift_shares_are_the_definitions(family):
    """The shares of a pre-attention norm's shift ("absdot", taken without normalising the components) are
    |A(x_k) · β| over the normalised components, in a padded batch (completeness cannot see shares: any split adds
    up)."""
    from inseq_mixing.methods.decompx import bias_shares, key_norms
    from inseq_mixing.methods.decompx_plan import BlockedStream, RowBlock

    case = padded_case(get_tiny(family), family)
    trace, ids = case.batched, case.next_ids()
    components = decompx(trace, ids, keep_layers=True).layers["decoder"][0]  # the second layer's input
    width = components.parts.shape[2]
    seen = components.available.any(0).numpy()
    block = RowBlock(slice(0, components.parts.shape[1]), torch.arange(width), components, np.arange(width), seen)
    stream = BlockedStream([block], width)
    attn, record = trace.spec.decoder.layers[1].self_attn, trace.decoder.layers[1].self_attn
    (norm,) = key_norms(attn, record, stream, "absdot")
    frozen = freeze_norm(attn.in_norm, record.norm_input)
    expected = bias_shares(components.like(frozen.linear(components.parts)), frozen.shift, "absdot")
    torch.testing.assert_close(norm.shares, expected, rtol=1e-4, atol=1e-6)


def naive_split(onto, over, bias, seen, options: DecompXOptions) -> torch.Tensor:
    """``onto`` ``(positions, components, D)`` plus ``bias`` (``(D,)`` or one per position) split over the components
    by the weights of ``over``: ``|component . bias|``, ``||component||`` or equally over the tokens each position sees
    (``seen``, ``(positions, components)``)."""
    bias = bias.expand_as(over[:, 0])[:, None]
    if options.bias == "absdot":
        weights = (over * bias).sum(-1).abs()
    elif options.bias == "norm":
        weights = over.norm(dim=-1)
    else:
        weights = torch.ones_like(seen)
    weights = weights * seen
    total = weights.sum(-1, keepdim=True)
    shares = torch.where(total > 0, weights / total, seen / seen.sum(-1, keepdim=True))
    return onto + shares[..., None] * bias


def naive_norm(parts, module, seen, options: DecompXOptions) -> torch.Tensor:
    """A layer norm on every component at the statistics of their sum, its shift split over the normalised ones."""
    total = parts.sum(1)
    deviation = (total.var(-1, unbiased=False) + module.eps).sqrt()
    normed = (parts - parts.mean(-1, keepdim=True)) / deviation[:, None, None] * module.weight
    return naive_split(normed, normed, module.bias, seen, options)


def naive_ffn(parts, first, activation, second, seen, options: DecompXOptions) -> torch.Tensor:
    """The FFN on every component: first map (``(D, F)`` weight, bias), the activation at its slope at the true
    pre-activation (``f(z)/z``, or the tangent with its intercept split like a bias), second map."""
    (first_weight, first_bias), (second_weight, second_bias) = first, second
    hidden = parts @ first_weight
    hidden = naive_split(hidden, hidden, first_bias, seen, options)
    pre = hidden.sum(1)
    if options.ffn_linearization == "zero_origin":
        hidden = hidden * torch.where(pre == 0, 0, activation(pre) / torch.where(pre == 0, 1, pre))[:, None]
    else:
        point = pre.detach().requires_grad_(True)
        (slope,) = torch.autograd.grad(activation(point).sum(), point)
        hidden = hidden * slope[:, None]
        hidden = naive_split(hidden, hidden, (activation(pre) - slope * pre).detach(), seen, options)
    output = hidden @ second_weight
    return naive_split(output, output, second_bias, seen, options)


def naive_attention(parts, probs, value, out, heads: int):
    """Attention output components ``sum_h sum_j alpha_ij (x_jk W_V^h) W_O^h`` and its bias (``W_O``'s plus the value
    bias carried through ``W_O``: the rows of attention sum to 1); ``value`` and ``out`` as ``(D, D)`` weight, bias."""
    (value_weight, value_bias), (out_weight, out_bias) = value, out
    values = (parts @ value_weight).unflatten(-1, (heads, -1))  # (keys, components, heads, head_dim)
    mixed = torch.einsum("hij,jkhe->ikhe", probs[0], values).flatten(-2) @ out_weight
    return mixed, out_bias + value_bias @ out_weight


def naive_gpt2_decompx(model, ids: torch.Tensor, targets: torch.Tensor, options: DecompXOptions) -> torch.Tensor:
    """DecompX of one GPT-2 sentence written from the definition on the HF modules' weights, dense and per sentence:
    ``(positions, components)`` scores of each position's target logit. Every bias (value bias through W_O, W_O's
    bias, both FFN biases, every layer norm's shift, a tangent's intercept) is split over the components of the
    vector it is added to (the attention bias: weights from the attention output's components, added to the residual
    stream's)."""
    n, d_model = ids.shape[1], model.config.n_embd
    out = model(ids, output_attentions=True, output_hidden_states=True)
    seen = torch.ones(n, n, dtype=model.dtype).tril()  # component k may be non-zero at position i iff k <= i
    x = torch.zeros(n, n, d_model, dtype=model.dtype)
    x[torch.arange(n), torch.arange(n)] = out.hidden_states[0][0]
    for block, probs in zip(model.transformer.h, out.attentions, strict=True):
        attn, mlp = block.attn, block.mlp
        value = attn.c_attn.weight[:, 2 * d_model :], attn.c_attn.bias[2 * d_model :]
        out_proj = attn.c_proj.weight, attn.c_proj.bias
        mixed, bias = naive_attention(naive_norm(x, block.ln_1, seen, options), probs, value, out_proj, attn.num_heads)
        x = naive_split(x + mixed, mixed, bias, seen, options)
        first, second = (mlp.c_fc.weight, mlp.c_fc.bias), (mlp.c_proj.weight, mlp.c_proj.bias)
        x = x + naive_ffn(naive_norm(x, block.ln_2, seen, options), first, mlp.act, second, seen, options)
    final = naive_norm(x, model.transformer.ln_f, seen, options)
    return torch.einsum("ikd,id->ik", final, model.lm_head.weight[targets[0]])


def naive_marian_decompx(model, source, target, explained, options: DecompXOptions) -> torch.Tensor:
    """DecompX of one Marian sentence pair from the definition, as :func:`naive_gpt2_decompx`: post-LN blocks (each
    norm after its residual sum, its shift split), the encoder over source components, the decoder over [source |
    target] with cross-attention carrying the encoder output's components, and the logit bias split by ``|score|``
    (``(target positions, S + T)`` scores)."""
    out = model(input_ids=source, decoder_input_ids=target, output_attentions=True, output_hidden_states=True)
    (num_source, num_target), d_model = (source.shape[1], target.shape[1]), model.config.d_model

    def linear(module):
        return module.weight.T, module.bias

    def block(x, layer, seen, sub_blocks):
        for attn, norm, probs, keys in sub_blocks:
            keys = x if keys is None else keys
            mixed, bias = naive_attention(keys, probs, linear(attn.v_proj), linear(attn.out_proj), attn.num_heads)
            x = naive_norm(naive_split(x + mixed, mixed, bias, seen, options), norm, seen, options)
        output = naive_ffn(x, linear(layer.fc1), layer.activation_fn, linear(layer.fc2), seen, options)
        return naive_norm(x + output, layer.final_layer_norm, seen, options)

    seen = torch.ones(num_source, num_source, dtype=model.dtype)
    x = torch.zeros(num_source, num_source, d_model, dtype=model.dtype)
    x[torch.arange(num_source), torch.arange(num_source)] = out.encoder_hidden_states[0][0]
    for layer, probs in zip(model.model.encoder.layers, out.encoder_attentions, strict=True):
        x = block(x, layer, seen, [(layer.self_attn, layer.self_attn_layer_norm, probs, None)])
    seen = torch.cat([torch.ones(num_target, num_source), torch.ones(num_target, num_target).tril()], 1).to(x.dtype)
    encoder = torch.cat([x, torch.zeros(num_source, num_target, d_model, dtype=x.dtype)], 1)  # the decoder's layout
    y = torch.zeros(num_target, num_source + num_target, d_model, dtype=model.dtype)
    y[torch.arange(num_target), num_source + torch.arange(num_target)] = out.decoder_hidden_states[0][0]
    layers = zip(model.model.decoder.layers, out.decoder_attentions, out.cross_attentions, strict=True)
    for layer, self_probs, cross_probs in layers:
        sub_blocks = [(layer.self_attn, layer.self_attn_layer_norm, self_probs, None),
                      (layer.encoder_attn, layer.encoder_attn_layer_norm, cross_probs, encoder)]  # fmt: skip
        y = block(y, layer, seen, sub_blocks)
    scores = torch.einsum("ikd,id->ik", y, model.lm_head.weight[explained[0]])
    logit_bias = model.final_logits_bias[0, explained[0]]
    return naive_split(scores[..., None], scores[..., None], logit_bias[:, None], seen, options)[..., 0]


@pytest.mark.parametrize(
    "options",
    [
        DecompXOptions(),
        DecompXOptions(bias="norm"),
        DecompXOptions(bias="equal"),
        DecompXOptions(ffn_linearization="tangent"),
    ],  # fmt: skip
    ids=lambda o: f"{o.bias}-{o.ffn_linearization}",
)
def test_gpt2_scores_equal_a_naive_decompx_from_the_definition(options):
    """Every bias split inside the layers (attention, FFN, norms) as the definition states it: completeness cannot see
    how a bias is shared, this can (float64, one sentence, the HF modules' weights)."""
    model = tiny_model("gpt2").double()
    kwargs = example_kwargs("gpt2")
    ids, targets = kwargs["input_ids"], next_tokens(kwargs)
    with torch.no_grad() if options.ffn_linearization == "zero_origin" else torch.enable_grad():
        expected = naive_gpt2_decompx(model, ids, targets, options)
    scores = decompx(trace_of(model, kwargs), targets, options=options)
    torch.testing.assert_close(expected.sum(-1), scores.logit[0], rtol=1e-9, atol=1e-9)  # the naive one is complete
    torch.testing.assert_close(scores.target[0], expected.detach(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("options", [DecompXOptions(), DecompXOptions(bias="norm")], ids=lambda o: o.bias)
def test_marian_scores_equal_a_naive_decompx_from_the_definition(options):
    """An encoder-decoder with post-LN blocks: the norms' shifts after each residual sum, the cross-attention's bias
    and the logit bias (made non-zero here) split as the definition states (float64, one sentence pair)."""
    model = tiny_model("marian").double()
    model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(0))
    kwargs = example_kwargs("marian")
    explained = next_tokens(kwargs)
    with torch.no_grad():
        expected = naive_marian_decompx(model, kwargs["input_ids"], kwargs["decoder_input_ids"], explained, options)
    scores = decompx(trace_of(model, kwargs), explained, options=options)
    num_source = kwargs["input_ids"].shape[1]
    torch.testing.assert_close(expected.sum(-1), scores.logit[0], rtol=1e-9, atol=1e-9)  # the naive one is complete
    torch.testing.assert_close(scores.source[0], expected[:, :num_source], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(scores.target[0], expected[:, num_source:], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "gpt_neox", "opt_post_ln", "marian"])
@pytest.mark.parametrize("bias", ["absdot", "separate"])
def test_rows_before_the_first_explained_one_are_skipped_and_the_others_unchanged(family, bias):
    """With the explained positions given, a decoder-only model's rows before the first of them (a prompt's) are not
    read out, and the last layer's queries, FFN and final norm skip them: those rows are 0, every later one is what
    the whole computation gives, in a padded batch (parallel FFN, post-LN and sandwich layouts included), with fewer
    FLOPs. Encoder–decoders show every row: unchanged."""
    case = padded_case(get_tiny(family), family)
    trace, ids = case.batched, case.next_ids()
    mask = trace.decoder.mask.bool()
    options = DecompXOptions(bias=bias, max_chunk_elements=600)  # blocks of a few positions
    with FlopCounterMode(display=False) as every_row:
        whole = decompx(trace, ids, options=options)
    for first in (2, 3, 4):  # at a block's start and inside a block
        positions = mask & (torch.arange(mask.shape[1]) >= first)
        with FlopCounterMode(display=False) as later_rows:
            later = decompx(trace, ids, options=options, positions=positions)
        skipped = 0 if family == "marian" else first
        assert later_rows.get_total_flops() <= every_row.get_total_flops()
        if skipped and first == 4:  # a whole block of positions lies before it
            assert later_rows.get_total_flops() < every_row.get_total_flops()
        pairs = [(later.target, whole.target), (later.source, whole.source), (later.bias, whole.bias)]
        for mine, theirs in pairs:
            if theirs is None:
                continue
            torch.testing.assert_close(mine[:, skipped:], theirs[:, skipped:], rtol=1e-5, atol=1e-6)
            assert (mine[:, :skipped] == 0).all()
        torch.testing.assert_close(later.logit, whole.logit)
