"""The Inseq side: registration and the rename, output shapes, rendering, save/load, options routing."""

import subprocess
import sys

import inseq
import pytest
import torch
from inseq.attr.feat.feature_attribution import FeatureAttribution

import inseq_mixing
from inseq_mixing.frontends.inseq_adapter import ValueZeroingAttribution
from inseq_mixing.testing import is_seq2seq, load_tiny, tiny_model, word_tokenizer

SOURCE = "the books in the library were read by many people"
TARGET = "les livres dans la bibliothèque ont été lus"
PROMPT = "the cat sat"
CONTINUATION = "the cat sat on the mat and it was good"


def attribute(model, family, **kwargs):
    if is_seq2seq(family):
        return model.attribute(SOURCE, TARGET, attribute_target=True, show_progress=False, **kwargs)
    return model.attribute(PROMPT, CONTINUATION, show_progress=False, **kwargs)


def test_registration_and_rename_in_fresh_interpreter():
    code = (
        "import inseq, inseq_mixing\n"
        "from inseq.attr.feat.feature_attribution import FeatureAttribution\n"
        "from inseq.attr.feat.perturbation_attribution import ValueZeroingAttribution as Builtin\n"
        "classes = FeatureAttribution.available_classes()\n"
        "assert classes['value_zeroing'].__module__.startswith('inseq_mixing'), classes['value_zeroing']\n"
        "assert classes['inseq_value_zeroing'] is Builtin\n"
        "assert inseq_mixing.register() == inseq_mixing.METHODS\n"
        "assert FeatureAttribution.available_classes() == classes\n"
        "print('ok')\n"
    )
    for _ in range(3):  # the registry iterates a set: check the winner is stable across interpreters
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert result.stdout.strip().endswith("ok"), result.stderr[-2000:]


def test_value_zeroing_name_loads_ours():
    assert FeatureAttribution.available_classes()["value_zeroing"] is ValueZeroingAttribution
    assert "inseq_value_zeroing" in inseq.list_feature_attribution_methods()


def test_shapes_with_attribute_target(family):
    model = load_tiny(family, "value_zeroing")
    out = attribute(model, family, per_layer=True)
    seq = out.sequence_attributions[0]
    num_layers = model.model.config.num_hidden_layers
    generated = len(seq.target) - seq.attr_pos_start
    assert seq.target_attributions.shape == (len(seq.target), generated, num_layers)
    if is_seq2seq(family):
        assert seq.source_attributions.shape == (len(seq.source), generated, num_layers)
        assert seq.sequence_scores["encoder_self_scores"].shape == (len(seq.source), len(seq.source), num_layers)
        column_sums = seq.source_attributions.sum(0)
        torch.testing.assert_close(column_sums, torch.ones_like(column_sums))
    else:
        assert seq.source_attributions is None
    # Column t attributes the token generated at position attr_pos_start + t: prefix rows beyond it are NaN.
    for col in range(generated):
        visible = seq.attr_pos_start + col
        assert not seq.target_attributions[:visible, col].isnan().any()
        assert seq.target_attributions[visible:, col].isnan().all()
        torch.testing.assert_close(seq.target_attributions[:visible, col].sum(0), torch.ones(num_layers))


def test_show_renders_source_and_target_heatmaps(family):
    out = attribute(load_tiny(family, "value_zeroing"), family)
    html = out.show(display=False, return_html=True)
    assert "Target Saliency Heatmap" in html
    assert ("Source Saliency Heatmap" in html) == is_seq2seq(family)
    assert "livres" in html if is_seq2seq(family) else "mat" in html


def test_save_load_round_trip_renders_heatmap(tmp_path):
    out = attribute(load_tiny("marian", "value_zeroing"), "marian", per_layer=True)
    path = tmp_path / "out.json"
    out.save(path)
    loaded = inseq.FeatureAttributionOutput.load(path)
    seq = loaded.sequence_attributions[0]
    assert seq._num_dimensions == 1
    torch.testing.assert_close(seq.source_attributions, out.sequence_attributions[0].source_attributions)
    html = loaded.show(display=False, return_html=True)
    assert "Source Saliency Heatmap" in html and "Target Saliency Heatmap" in html
    aggregated = loaded.aggregate().sequence_attributions[0]
    assert aggregated.source_attributions.ndim == 2


def test_options_are_routed(seq2seq_family):
    model = load_tiny(seq2seq_family, "value_zeroing")
    base = attribute(model, seq2seq_family).sequence_attributions[0]
    euclid = attribute(model, seq2seq_family, similarity_metric="euclidean").sequence_attributions[0]
    assert not torch.allclose(base.source_attributions, euclid.source_attributions)
    rolled = attribute(model, seq2seq_family, rollout=True).sequence_attributions[0]
    assert rolled.source_attributions.ndim == 2
    totals = rolled.source_attributions.sum(0) + rolled.target_attributions.nansum(0)
    torch.testing.assert_close(totals, torch.ones_like(totals))
    assert "Source Saliency Heatmap" in rolled.show(display=False, return_html=True)
    joint = attribute(model, seq2seq_family, normalization="joint").sequence_attributions[0]
    totals = joint.source_attributions.sum(0) + joint.target_attributions.nansum(0)
    torch.testing.assert_close(totals, torch.ones_like(totals))


def test_without_attribute_target_scores_go_to_sequence_scores():
    model = load_tiny("t5", "value_zeroing")
    seq = model.attribute(SOURCE, TARGET, show_progress=False).sequence_attributions[0]
    assert seq.target_attributions is None
    assert {"encoder_self_scores", "decoder_self_scores"} <= set(seq.sequence_scores)


def test_batch_of_sentences_equals_one_by_one():
    model = load_tiny("gpt2", "value_zeroing")
    texts = ["the cat sat on the mat", "the dog"]
    together = model.attribute(texts, show_progress=False, generation_args={"max_new_tokens": 3})
    for text, seq in zip(texts, together.sequence_attributions, strict=True):
        generated = "".join([text, " ", " ".join(t.token for t in seq.target[len(text.split()) :])])
        alone = model.attribute(text, generated.strip(), show_progress=False).sequence_attributions[0]
        torch.testing.assert_close(
            seq.target_attributions, alone.target_attributions, equal_nan=True, atol=1e-5, rtol=1e-4
        )


def test_unsupported_model_names_supported_families():
    """A model type no spec knows (made up, so that the test does not change when a family is added)."""
    model = tiny_model("gpt2")
    model.config.model_type = "made_up_family"
    with pytest.raises(inseq_mixing.UnsupportedModelError, match="made_up_family.*Marian.*GPT-2.*Llama.*OLMo-2"):
        inseq_mixing.get_spec(model)
    with pytest.raises(inseq_mixing.UnsupportedModelError, match="Supported families"):
        inseq.load_model(model, "value_zeroing", tokenizer=word_tokenizer(seq2seq=False))


def test_sdpa_model_is_traced_with_eager_and_restored():
    eager = load_tiny("bart", "value_zeroing")
    sdpa_model = tiny_model("bart", attn_implementation="sdpa")
    sdpa = inseq.load_model(sdpa_model, "value_zeroing", tokenizer=word_tokenizer())
    first = attribute(eager, "bart").sequence_attributions[0]
    second = attribute(sdpa, "bart").sequence_attributions[0]
    torch.testing.assert_close(first.source_attributions, second.source_attributions)
    assert sdpa_model.config._attn_implementation == "sdpa"
