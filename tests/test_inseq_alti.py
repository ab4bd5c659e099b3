"""``alti``, ``alti_logit`` and ``decompx`` through Inseq: shapes, completeness against the model's own logits,
contrast, padded batches, signed heatmaps, save/load."""

import inseq
import pytest
import torch
from inseq.data.viz import get_attribution_colors
from inseq.utils.viz_utils import red_transparent_blue_colormap

import inseq_mixing
from inseq_mixing.frontends.inseq_adapter import SignedMixingSequenceOutput
from inseq_mixing.testing import is_seq2seq, load_tiny

from .test_inseq_glue import CONTINUATION, PROMPT, SOURCE, TARGET, attribute

UNATTRIBUTED = ("unattributed_ffn", "unattributed_attention_bias", "unattributed_norm_bias", "unattributed_logit_bias")
LOGIT_METHODS = ("alti_logit", "decompx")
EXPLAINED = ("logit", "contrast_logits_diff", "logit_after_softcap", "contrast_logits_diff_after_softcap")


def token_ids(tokens) -> torch.Tensor:
    return torch.tensor([[token.id for token in tokens]])


def own_logits(model, seq) -> torch.Tensor:
    """The HF model's logit of every generated token of ``seq``, teacher-forced, without the plugin."""
    target = token_ids(seq.target)
    positions = torch.arange(seq.attr_pos_start, target.shape[1])
    with torch.no_grad():
        if model.is_encoder_decoder:
            logits = model.model(input_ids=token_ids(seq.source), decoder_input_ids=target).logits
        else:
            logits = model.model(input_ids=target).logits
    return logits[0, positions - 1, target[0, positions]]


def token_total(seq) -> torch.Tensor:
    total = seq.target_attributions.nansum(0)
    return total if seq.source_attributions is None else total + seq.source_attributions.sum(0)


def explained_total(seq) -> torch.Tensor:
    """Token scores plus every returned term not attributed to tokens."""
    return token_total(seq) + sum(score for name, score in seq.step_scores.items() if name not in EXPLAINED)


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_logit_scores_add_up_to_the_models_own_logit(family, method):
    model = load_tiny(family, method)
    seq = attribute(model, family).sequence_attributions[0]
    assert isinstance(seq, SignedMixingSequenceOutput)
    generated = len(seq.target) - seq.attr_pos_start
    assert seq.target_attributions.shape == (len(seq.target), generated)
    cap = getattr(model.model.config, "final_logit_softcapping", None)
    expected = {"logit", *UNATTRIBUTED} if method == "alti_logit" else {"logit"}
    assert set(seq.step_scores) == (expected if cap is None else {*expected, "logit_after_softcap"})
    if cap is None:
        torch.testing.assert_close(seq.step_scores["logit"], own_logits(model, seq), atol=1e-5, rtol=1e-5)
    else:  # the parts add up to the logit before the cap; the model's own logit is reported beside it
        capped = seq.step_scores["logit_after_softcap"]
        torch.testing.assert_close(capped, own_logits(model, seq), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cap * torch.tanh(seq.step_scores["logit"] / cap), capped, atol=1e-5, rtol=1e-5)
        assert (seq.step_scores["logit"].abs() > capped.abs() + 1e-3).any()  # the cap bites on the tiny model
    torch.testing.assert_close(explained_total(seq), seq.step_scores["logit"], atol=1e-4, rtol=1e-4)
    for col in range(generated):
        assert seq.target_attributions[seq.attr_pos_start + col :, col].isnan().all()
        assert not seq.target_attributions[: seq.attr_pos_start + col, col].isnan().any()
    html = seq.show(display=False, return_html=True)
    assert "Target Saliency Heatmap" in html and "logit" in html


def test_alti_rollout_columns_sum_to_one_and_layers_on_request(family):
    model = load_tiny(family, "alti")
    seq = attribute(model, family).sequence_attributions[0]
    torch.testing.assert_close(token_total(seq), torch.ones(seq.target_attributions.shape[1]))
    assert (seq.target_attributions.nan_to_num() >= 0).all()
    if is_seq2seq(family):
        num_source = len(seq.source)
        assert seq.sequence_scores["encoder_self_scores"].shape == (num_source, num_source)
    layers = attribute(model, family, per_layer=True).sequence_attributions[0]
    assert layers.target_attributions.shape[-1] == model.model.config.num_hidden_layers
    html = layers.show(display=False, return_html=True)
    assert "Target Saliency Heatmap" in html


@pytest.mark.parametrize("method", LOGIT_METHODS)
@pytest.mark.parametrize("family", ["marian", "t5", "gpt2"])
def test_contrastive_explanation_follows_inseq_convention(family, method):
    model = load_tiny(family, method)
    if is_seq2seq(family):
        text, target, foil = SOURCE, TARGET, TARGET.replace("livres", "ont").replace("lus", "été")
    else:
        text, target, foil = PROMPT, CONTINUATION, CONTINUATION.replace("mat", "cat")
    plain = model.attribute(text, target, attribute_target=True, show_progress=False).sequence_attributions[0]
    contrast = model.attribute(
        text, target, attribute_target=True, show_progress=False,
        attributed_fn="contrast_logits_diff", contrast_targets=foil,
    ).sequence_attributions[0]  # fmt: skip
    direct = model.attribute(
        text, target, attribute_target=True, show_progress=False, contrast_targets=foil
    ).sequence_attributions[0]
    difference = contrast.step_scores["contrast_logits_diff"]
    torch.testing.assert_close(direct.step_scores["contrast_logits_diff"], difference)
    torch.testing.assert_close(explained_total(contrast), difference, atol=1e-4, rtol=1e-4)
    assert (difference == 0).any() and (difference != 0).any()  # foil = target at some steps only
    assert not torch.allclose(difference, plain.step_scores["logit"])


def test_contrast_target_without_aligned_token_is_refused():
    model = load_tiny("marian", "alti_logit")
    with pytest.raises(ValueError, match="contrast_targets_alignments"):
        model.attribute(SOURCE, TARGET, attribute_target=True, show_progress=False, contrast_targets="les")


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_padded_batch_equals_one_by_one(method):
    model = load_tiny("llama", method)
    texts = ["the cat sat on the mat", "the dog"]
    together = model.attribute(texts, show_progress=False, generation_args={"max_new_tokens": 3})
    for text, seq in zip(texts, together.sequence_attributions, strict=True):
        generated = " ".join([text, *(t.token for t in seq.target[len(text.split()) :])])
        alone = model.attribute(text, generated, show_progress=False).sequence_attributions[0]
        torch.testing.assert_close(
            seq.target_attributions, alone.target_attributions, equal_nan=True, atol=1e-5, rtol=1e-4
        )
        assert set(seq.step_scores) == set(alone.step_scores)
        for name in seq.step_scores:
            torch.testing.assert_close(seq.step_scores[name], alone.step_scores[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_signed_heatmap_uses_a_diverging_scale_and_survives_save_load(tmp_path, method):
    out = attribute(load_tiny("bart", method), "bart", **({"bias": "separate"} if method == "decompx" else {}))
    seq = out.sequence_attributions[0]
    scores = torch.cat([seq.source_attributions.flatten(), seq.target_attributions.flatten()]).nan_to_num()
    assert scores.min() < 0 < scores.max()
    aggregated = seq.aggregate()
    torch.testing.assert_close(aggregated.source_attributions, seq.source_attributions)  # not renormalised
    assert aggregated.maximum == -aggregated.minimum == float(scores.abs().max())
    colours = get_attribution_colors([aggregated], cmap=red_transparent_blue_colormap(), return_strings=False)
    source_colours = colours[0]
    row, col = divmod(int(seq.source_attributions.argmin()), seq.source_attributions.shape[1])
    red, _, blue, _ = source_colours[row][col]
    assert blue > red  # negative scores are blue, positive ones red
    html = out.show(display=False, return_html=True)
    extra = "unattributed_ffn" if method == "alti_logit" else "unattributed_bias"
    assert "Source Saliency Heatmap" in html and extra in html
    path = tmp_path / "out.json"
    out.save(path)
    loaded = inseq.FeatureAttributionOutput.load(path).sequence_attributions[0]
    assert isinstance(loaded, SignedMixingSequenceOutput)
    torch.testing.assert_close(loaded.source_attributions, seq.source_attributions)
    torch.testing.assert_close(loaded.step_scores[extra], seq.step_scores[extra])
    assert "Target Saliency Heatmap" in loaded.show(display=False, return_html=True)


@pytest.mark.parametrize(
    ("family", "options"),
    [
        ("mbart", {"bias": "norm"}),
        ("mbart", {"bias": "equal"}),
        ("gpt2", {"ffn_linearization": "tangent"}),
        ("t5_gated", {"gated_split": "gate"}),
        ("t5_gated", {"include_ffn": False}),
    ],
)
def test_decompx_options_are_routed(family, options):
    """T5 has no biases at all, so bias splits are checked on mBART."""
    model = load_tiny(family, "decompx")
    base = attribute(model, family).sequence_attributions[0]
    seq = attribute(model, family, **options).sequence_attributions[0]
    assert not torch.allclose(seq.target_attributions, base.target_attributions, equal_nan=True)
    torch.testing.assert_close(explained_total(seq), seq.step_scores["logit"], atol=1e-4, rtol=1e-4)


def test_unknown_decompx_option_is_refused():
    with pytest.raises(ValueError, match="absdot"):
        attribute(load_tiny("gpt2", "decompx"), "gpt2", bias="proportional")


def test_alti_logit_per_head_through_inseq(family):
    """per_head=True adds a (layer, head) axis; heads plus the direct term and the unattributed terms give the
    logit, as the plain scores do."""
    model = load_tiny(family, "alti_logit")
    seq = attribute(model, family, per_head=True).sequence_attributions[0]
    layers = inseq_mixing.get_spec(model.model).decoder.layers
    heads = layers[0].self_attn.num_heads
    layers = len(layers)
    assert seq.target_attributions.shape[-1] == heads * layers * (2 if is_seq2seq(family) else 1)
    assert "unattributed_embedding" in seq.step_scores
    total = seq.target_attributions.nansum((0, 2)) + sum(
        score for name, score in seq.step_scores.items() if name not in EXPLAINED
    )
    if seq.source_attributions is not None:
        total = total + seq.source_attributions.sum((0, 2))
    torch.testing.assert_close(total, seq.step_scores["logit"], atol=1e-4, rtol=1e-4)


def test_alti_per_head_through_inseq(family):
    """per_head=True gives per-layer maps with a (layer, head or residual) axis: each generated token's scores of one
    layer, over every slot, source and target, sum to 1."""
    model = load_tiny(family, "alti")
    seq = attribute(model, family, per_head=True).sequence_attributions[0]
    layers = inseq_mixing.get_spec(model.model).decoder.layers
    slots = layers[0].self_attn.num_heads + 1
    sub_blocks = 2 if is_seq2seq(family) else 1
    assert seq.target_attributions.shape[-1] == sub_blocks * len(layers) * slots
    total = seq.target_attributions.nansum(0)
    if seq.source_attributions is not None:
        total = total + seq.source_attributions.sum(0)
    per_layer = total.reshape(total.shape[0], sub_blocks, len(layers), slots).sum((1, 3))
    torch.testing.assert_close(per_layer, torch.ones_like(per_layer))


def test_decompx_per_head_through_inseq_sums_like_alti_logits_heads_on_bias_free_models():
    """Llama has no value bias: summed over tokens, each head's DecompX scores equal ALTI-logit's for that head."""
    heads = {}
    for method in ("decompx", "alti_logit"):
        seq = attribute(load_tiny("llama", method), "llama", per_head=True).sequence_attributions[0]
        heads[method] = seq.target_attributions.nansum(0)  # (generated, layers · H)
    layers = inseq_mixing.get_spec(load_tiny("llama", "decompx").model).decoder.layers
    assert heads["decompx"].shape[-1] == len(layers) * layers[0].self_attn.num_heads
    torch.testing.assert_close(heads["decompx"], heads["alti_logit"], atol=1e-5, rtol=1e-4)


def test_decompx_per_head_through_inseq(family):
    model = load_tiny(family, "decompx")
    seq = attribute(model, family, per_head=True).sequence_attributions[0]
    layers = inseq_mixing.get_spec(model.model).decoder.layers
    expected = len(layers) * layers[0].self_attn.num_heads * (2 if is_seq2seq(family) else 1)
    assert seq.target_attributions.shape[-1] == expected
    assert torch.isfinite(seq.target_attributions.nan_to_num()).all() and seq.target_attributions.nansum() != 0
    if seq.source_attributions is not None:
        assert seq.source_attributions.shape[-1] == expected and seq.source_attributions.abs().sum() > 0


def test_attn_lrp_through_inseq_adds_up_with_the_absorbed_part(family):
    """Every family, with attribute_target=True for encoder–decoders: relevances + absorbed = the model's own logit."""
    model = load_tiny(family, "attn_lrp")
    seq = attribute(model, family).sequence_attributions[0]
    assert set(seq.step_scores) >= {"unattributed_absorbed", "logit"}
    total = token_total(seq) + seq.step_scores["unattributed_absorbed"]
    torch.testing.assert_close(total, seq.step_scores["logit"], atol=1e-4, rtol=1e-4)
    explained = "logit_after_softcap" if "logit_after_softcap" in seq.step_scores else "logit"
    torch.testing.assert_close(seq.step_scores[explained], own_logits(model, seq), atol=1e-4, rtol=1e-4)
    html = seq.show(display=False, return_html=True)
    assert "Target Saliency Heatmap" in html and ("Source Saliency Heatmap" in html) == is_seq2seq(family)
