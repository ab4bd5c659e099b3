"""An Inseq user's habits on the package's own front ends (encoder-only and speech): Inseq's keyword names mean what
they mean in Inseq, and Inseq's step scores are the model's own numbers."""

import pytest
import torch

import inseq_mixing
from inseq_mixing.testing import encoder_tokenizer, speech_processor, synthetic_audio, tiny_encoder, tiny_speech

TEXT = "the [MASK] sat on the mat"


@pytest.fixture(scope="module")
def masked_lm():
    model, tokenizer = tiny_encoder("bert", "masked_lm"), encoder_tokenizer()
    return model, tokenizer, inseq_mixing.load_model(model, "alti_logit", tokenizer=tokenizer)


def test_an_encoder_takes_inseq_keywords_and_answers_its_step_scores(masked_lm):
    model, tokenizer, front = masked_lm
    out = front.attribute(TEXT, generated_texts="cat", attributed_fn="logit", step_scores=["probability", "entropy"],
                          show_progress=False)  # fmt: skip
    sequence = out.sequence_attributions[0]
    alone = front.attribute(TEXT, "cat", show_progress=False).sequence_attributions[0]
    assert torch.equal(sequence.source_attributions, alone.source_attributions)  # generated_texts is targets
    assert out.info["step_scores"] == ["probability", "entropy"]
    encoded = tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        logits = model(**encoded).logits[0]
    mask = int((encoded.input_ids[0] == tokenizer.mask_token_id).nonzero())
    probabilities = logits[mask].double().softmax(-1)
    cat = front.output_index("cat")
    assert sequence.step_scores["probability"].item() == pytest.approx(float(probabilities[cat]), rel=1e-5)
    entropy = -(probabilities * probabilities.log()).sum()
    assert sequence.step_scores["entropy"].item() == pytest.approx(float(entropy), rel=1e-5)
    assert sequence.step_scores["logit"].item() == pytest.approx(float(logits[mask, cat]), abs=1e-4)  # the method's

    contrast = front.attribute(TEXT, "cat", contrast_targets="dog", attributed_fn="contrast_logits_diff",
                               show_progress=False).sequence_attributions[0]  # fmt: skip
    difference = logits[mask, cat] - logits[mask, front.output_index("dog")]
    assert contrast.step_scores["contrast_logits_diff"].item() == pytest.approx(float(difference), abs=1e-4)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"attributed_fn": "probability"}, r"explains 'logit'"),
        ({"attributed_fn": "logit", "contrast_targets": "dog"}, r"explains 'contrast_logits_diff'"),
        ({"step_scores": ["perplexity"]}, r"step_scores \['perplexity'\]"),
        ({"generated_texts": "cat", "targets": "dog"}, r"targets once"),
    ],
)
def test_an_inseq_keyword_the_front_end_cannot_honour_is_refused_before_any_work(masked_lm, keywords, message):
    _, _, front = masked_lm
    with pytest.raises(ValueError, match=message):
        front.attribute(TEXT, show_progress=False, **keywords)


def test_whisper_takes_generated_texts_and_answers_the_probability_of_each_transcript_token():
    model, processor = tiny_speech("whisper"), speech_processor("whisper")
    front = inseq_mixing.load_model(model, "alti", processor=processor)
    audio = synthetic_audio(0.6)
    out = front.attribute(audio, generated_texts="the cat sat", step_scores="probability", show_progress=False)
    sequence = out.sequence_attributions[0]
    alone = front.attribute(audio, "the cat sat", show_progress=False).sequence_attributions[0]
    assert torch.equal(sequence.source_attributions, alone.source_attributions)
    ids = [token.id for token in sequence.target]
    features = processor.feature_extractor(audio, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        logits = model(input_features=features, decoder_input_ids=torch.tensor([ids[:-1]])).logits[0].double()
    expected = [float(logits[k - 1].softmax(-1)[ids[k]]) for k in range(sequence.attr_pos_start, len(ids))]
    assert sequence.step_scores["probability"].tolist() == pytest.approx(expected, rel=1e-5)


def test_integrated_gradients_on_an_encoder_takes_captums_options(masked_lm):
    """``baselines`` (here the mask token's embedding at every position), ``internal_batch_size`` and
    ``return_convergence_delta``: the scores add up to the logit at the input minus the logit at that baseline, up to
    the convergence delta Captum reports; batching the steps changes nothing; an unknown option names the known
    ones."""
    model, tokenizer, _ = masked_lm
    front = inseq_mixing.load_model(model, "integrated_gradients", tokenizer=tokenizer)
    options = {"n_steps": 16, "baselines": tokenizer.mask_token, "return_convergence_delta": True}
    sequence = front.attribute(TEXT, "cat", show_progress=False, **options).sequence_attributions[0]
    batched = front.attribute(TEXT, "cat", show_progress=False, internal_batch_size=5, **options)
    torch.testing.assert_close(batched.sequence_attributions[0].source_attributions, sequence.source_attributions)
    encoded = tokenizer(TEXT, return_tensors="pt")
    mask = int((encoded.input_ids[0] == tokenizer.mask_token_id).nonzero())
    cat = front.output_index("cat")
    embeddings = model.get_input_embeddings()
    baseline = embeddings(torch.tensor([[tokenizer.mask_token_id]])).expand(1, encoded.input_ids.shape[1], -1)
    with torch.no_grad():
        at_input = model(**encoded).logits[0, mask, cat]
        at_baseline = model(inputs_embeds=baseline, attention_mask=encoded.attention_mask).logits[0, mask, cat]
    total, delta = float(sequence.source_attributions.sum()), float(sequence.step_scores["convergence_delta"][0])
    assert total - delta == pytest.approx(float(at_input - at_baseline), abs=1e-4)
    with pytest.raises(ValueError, match=r"\['bogus'\] for integrated_gradients: it takes \['n_steps'"):
        front.attribute(TEXT, bogus=1, show_progress=False)
