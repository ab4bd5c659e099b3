"""Attention rollout, attention norm (N, N-Res, N-ResLN, context-mixing ratio) and GlobEnc: against direct
computations of the papers' formulas on the HF modules, padding invariance, causality, and through Inseq."""

import pytest
import torch

from inseq_mixing.methods.norm_based import attention_norm, attention_rollout, globenc
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import is_seq2seq, load_tiny

from .conftest import example_kwargs, get_tiny, trace_of
from .reference import capture_value_inputs, frozen_norm_map, hf_attention_part, hf_value_vectors
from .test_inseq_glue import CONTINUATION, PROMPT, SOURCE, TARGET

VARIANTS = {"N": {}, "N-Res": {"residual": True}, "N-ResLN": {"layer_norm": True}}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_layers_mean_summed_a_layer_at_a_time_is_the_mean_of_the_layers_maps(family, variant):
    """The default read-out (the layers' mean, summed one layer's map at a time from the first explained row) equals
    the mean of the per-layer maps on the rows it computes, and the context-mixing ratios too (asked from the first
    row, as a span asks: NaN on the rows not computed); an encoder–decoder's rows are all computed."""
    trace = trace_of(get_tiny(family), example_kwargs(family))
    per_layer = attention_norm(trace, **VARIANTS[variant])
    first_row = 2
    mean = attention_norm(trace, **VARIANTS[variant], per_layer=False, first_row=first_row, ratios_from_first_row=True)
    start = 0 if trace.spec.is_encoder_decoder else first_row
    torch.testing.assert_close(mean.target[:, start:], per_layer.target.mean(1)[:, start:], atol=1e-6, rtol=1e-5)
    assert not mean.target[:, :start].any()  # not computed: nothing reads them
    for name in ("source", "encoder"):
        if getattr(per_layer, name) is not None:
            torch.testing.assert_close(getattr(mean, name), getattr(per_layer, name).mean(1), atol=1e-6, rtol=1e-5)
    ratio, every_row = mean.positions["context_mixing_ratio"], per_layer.positions["context_mixing_ratio"]
    torch.testing.assert_close(ratio[..., start:], every_row[..., start:])
    assert ratio[..., :start].isnan().all()  # not computed: marked, not given as a ratio


def naive_vectors(model, family, variant: str, layer_index: int):
    """Decoder self-attention vectors ``z_ij`` of batch 0 at one layer, pair by pair through the HF value and output
    projections (and the frozen norms, each applied through the HF norm module)."""
    kwargs = example_kwargs(family)
    trace, spec = trace_of(model, kwargs), get_spec(model)
    layer, record = spec.decoder.layers[layer_index], trace.decoder.layers[layer_index]
    attn, attn_record = layer.self_attn, record.self_attn
    values = hf_value_vectors(attn, capture_value_inputs(model, spec, kwargs)[("decoder", layer_index, "self")])
    norms = []
    if variant in ("N-ResLN", "GlobEnc"):
        if attn.post_norm is not None:
            norms.append((attn.post_norm, attn_record.norm_input[0]))
        elif variant == "N-ResLN" and not layer.ffn.parallel:
            following = layer.cross_attn if layer.cross_attn is not None else layer.ffn
            norm_input = record.cross_attn.norm_input if layer.cross_attn is not None else record.ffn_norm_input
            if following.in_norm is not None:
                norms.append((following.in_norm, norm_input[0]))
        if variant == "GlobEnc" and layer.cross_attn is None and layer.ffn.post_norm is not None:
            norms.append((layer.ffn.post_norm, record.ffn_norm_input[0]))
    num = values.shape[0]
    vectors = torch.zeros(num, num, record.input.shape[-1])
    with torch.no_grad():
        for i in range(num):
            for j in range(i + 1):
                part = hf_attention_part(attn, values, attn_record.probs[0], i, j)
                if attn.out_norm is not None:
                    part = frozen_norm_map(attn.out_norm, attn_record.output[0, i])(part)
                if variant != "N" and i == j:
                    part = part + record.input[0, i]
                for norm, norm_input in norms:
                    part = frozen_norm_map(norm, norm_input[i])(part)
                vectors[i, j] = part
    return trace, vectors


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_attention_norm_matches_the_definition(family, variant):
    model = get_tiny(family)
    trace = trace_of(model, example_kwargs(family))
    maps = attention_norm(trace, **VARIANTS[variant])
    for layer_index in range(maps.target.shape[1]):
        _, vectors = naive_vectors(model, family, variant, layer_index)
        naive = torch.linalg.vector_norm(vectors, dim=-1)
        torch.testing.assert_close(maps.target[0, layer_index], naive, atol=1e-5, rtol=1e-4)
        if variant != "N":
            own = vectors.diagonal(dim1=0, dim2=1).T
            mixed = torch.linalg.vector_norm(vectors.sum(1) - own, dim=-1)
            ratio = mixed / (mixed + torch.linalg.vector_norm(own, dim=-1))
            torch.testing.assert_close(
                maps.positions["context_mixing_ratio"][0, layer_index], ratio, atol=1e-5, rtol=1e-4
            )


def test_globenc_layer_maps_match_the_definition(decoder_family):
    model = get_tiny(decoder_family)
    trace = trace_of(model, example_kwargs(decoder_family))
    maps = globenc(trace, rollout=False)
    for layer_index in range(maps.target.shape[1]):
        _, vectors = naive_vectors(model, decoder_family, "GlobEnc", layer_index)
        naive = torch.linalg.vector_norm(vectors, dim=-1)
        torch.testing.assert_close(
            maps.target[0, layer_index], naive / naive.sum(-1, keepdim=True), atol=1e-5, rtol=1e-4
        )
    rolled = globenc(trace).target[0]
    expected = maps.target[0, 0]
    for layer_index in range(1, maps.target.shape[1]):
        expected = maps.target[0, layer_index] @ expected
    torch.testing.assert_close(rolled, expected, atol=1e-6, rtol=1e-5)


def test_attention_rollout_matches_the_definition(family):
    trace = trace_of(get_tiny(family), example_kwargs(family))
    maps = attention_rollout(trace)
    if is_seq2seq(family):  # the joint rollout: source and target columns sum to 1 together
        torch.testing.assert_close(maps.target.sum(-1) + maps.source.sum(-1), torch.ones(maps.target.shape[:2]))
        encoder = torch.eye(trace.encoder.mask.shape[1])
        for record in trace.encoder.layers:
            layer = 0.5 * record.self_attn.probs[0].mean(0) + 0.5 * torch.eye(encoder.shape[0])
            encoder = (layer / layer.sum(-1, keepdim=True)) @ encoder
        torch.testing.assert_close(maps.encoder[0], encoder, atol=1e-6, rtol=1e-5)
        return
    expected = torch.eye(trace.decoder.mask.shape[1])
    sinks = trace.spec.attention_sinks  # GPT-OSS: a row's rest went to the sink, which passes nothing on
    for record in trace.decoder.layers:
        layer = 0.5 * record.self_attn.probs[0].mean(0) + 0.5 * torch.eye(expected.shape[0])
        expected = (layer if sinks else layer / layer.sum(-1, keepdim=True)) @ expected
    torch.testing.assert_close(maps.target[0], expected, atol=1e-6, rtol=1e-5)
    if sinks:  # the sink's share says where the rest of each row went, and it is not nothing
        torch.testing.assert_close(maps.positions["sink_share"][0], 1 - expected.sum(-1), atol=1e-6, rtol=1e-5)
        assert float(maps.positions["sink_share"].min()) > 1e-3
    else:
        assert "sink_share" not in maps.positions


METHODS = {
    "attention_rollout": lambda trace: attention_rollout(trace),
    "attention_norm": lambda trace: attention_norm(trace, layer_norm=True),
    "globenc": lambda trace: globenc(trace),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_through_inseq(family, method):
    model = load_tiny(family, method)
    layers = {"per_layer": True} if method == "attention_norm" else {}  # its maps per layer, as the papers read them
    if model.is_encoder_decoder:
        out = model.attribute(SOURCE, TARGET, attribute_target=True, show_progress=False, **layers)
    else:
        out = model.attribute(PROMPT, PROMPT + CONTINUATION, show_progress=False, **layers)
    seq = out.sequence_attributions[0]
    generated = len(seq.target) - seq.attr_pos_start
    assert seq.target_attributions.shape[:2] == (len(seq.target), generated)
    if method == "attention_norm":
        assert seq.target_attributions.shape[-1] == model.model.config.num_hidden_layers
        ratio = seq.sequence_scores["context_mixing_ratio"]
        assert ratio.shape[-1] == model.model.config.num_hidden_layers and ((ratio >= 0) & (ratio <= 1)).all()
    else:  # rolled out: each generated token's scores sum to 1 over source and target (and the sink, if any)
        total = seq.target_attributions.nansum(0)
        if seq.source_attributions is not None:
            total = total + seq.source_attributions.sum(0)
        if "sink_share" in (seq.sequence_scores or {}):  # per traced position: the rows predicting generated tokens
            start = seq.attr_pos_start - 1
            total = total + seq.sequence_scores["sink_share"][start : start + generated]
        torch.testing.assert_close(total, torch.ones(generated))
    assert "Target Saliency Heatmap" in seq.show(display=False, return_html=True)
