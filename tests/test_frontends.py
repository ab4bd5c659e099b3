"""The one router (`inseq_mixing.frontends`): every input a user has is given its kind in one place, from one config
read, and every entry point builds its front end there."""

import json

import pytest
import torch

import inseq_mixing
from inseq_mixing import frontends
from inseq_mixing.frontends import ENCODER, GENERATION, SPEECH, identify
from inseq_mixing.testing import encoder_tokenizer, tiny_encoder, tiny_model, tiny_speech, word_tokenizer


@pytest.mark.parametrize(
    "build, kind",
    [
        (lambda: tiny_model("gpt2"), GENERATION),
        (lambda: tiny_model("marian"), GENERATION),
        (lambda: tiny_encoder("bert", "masked_lm"), ENCODER),
        (lambda: tiny_encoder("roberta", "sequence_classification"), ENCODER),
        (lambda: tiny_encoder("bert", "bare"), ENCODER),  # a bare encoder (BertModel)
        (lambda: tiny_speech("whisper"), SPEECH),
        (lambda: tiny_speech("whisper", head=False), SPEECH),  # WhisperEncoder
        (lambda: tiny_speech("wav2vec2"), SPEECH),
    ],
    ids=["gpt2", "marian", "bert-mlm", "roberta-classifier", "bare-bert", "whisper", "whisper-encoder", "wav2vec2"],
)
def test_every_model_object_and_its_saved_folder_have_one_kind(build, kind, tmp_path):
    model = build()
    assert identify(model).kind == kind
    model.save_pretrained(tmp_path)
    found = identify(str(tmp_path))
    assert found.kind == kind and found.model_type == model.config.model_type


def test_front_ends_and_inseq_models_keep_their_kind():
    import inseq

    encoder = inseq_mixing.load_model(tiny_encoder("bert"), "alti", tokenizer=encoder_tokenizer())
    assert identify(encoder).kind == ENCODER
    generation = inseq.load_model(tiny_model("gpt2"), "alti", tokenizer=word_tokenizer(False))
    assert identify(generation).kind == GENERATION
    assert identify("demo").kind == GENERATION
    assert identify("/no/such/folder").kind == GENERATION  # Inseq's loader says what is wrong with it


def test_another_method_on_a_front_end_keeps_its_model_and_tokenizer():
    encoder = inseq_mixing.load_model(tiny_encoder("bert"), "alti", tokenizer=encoder_tokenizer())
    other = inseq_mixing.load_model(encoder, "value_zeroing")
    assert other.method == "value_zeroing" and other.model is encoder.model and other.tokenizer is encoder.tokenizer
    assert inseq_mixing.load_model(encoder, "alti") is encoder


def test_a_refused_object_is_left_as_it_was():
    """A missing tokenizer is refused before the model is converted (dtype) or moved."""
    import torch

    model = tiny_encoder("bert")
    with pytest.raises(ValueError, match="tokenizer"):
        inseq_mixing.load_model(model, "alti", dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float32


def test_a_dataset_run_reads_a_names_config_once(tmp_path, monkeypatch):
    """The runner asks the router once: the encoder front end's folder has its config read a single time by the
    package (Hugging Face's own loaders read it again for the weights and tokenizer, as they must)."""
    folder = tmp_path / "mlm"
    tiny_encoder("bert").save_pretrained(folder)
    encoder_tokenizer().save_pretrained(folder)
    reads = []
    original = frontends.router.read_config
    monkeypatch.setattr(frontends.router, "read_config", lambda name: reads.append(name) or original(name))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"id": "a", "source": "the cat [MASK] on the mat", "target": "sat"}))
    inseq_mixing.attribute_dataset(
        str(folder), "alti", str(data), tmp_path / "run", id_column="id", show_progress=False
    )
    assert reads == [str(folder)]
    assert inseq_mixing.load_run(tmp_path / "run").ids() == ["a"]


def test_the_layout_turns_rows_into_inseq_axes_and_marks_what_a_decoder_cannot_see():
    """``(slots, positions, tokens)`` rows become ``(tokens, explained, slots)``, in the scores' own precision; a
    decoder's map over its own text is NaN on every token after the explained one's position."""
    from inseq_mixing.frontends.layout import decoder_layout, tokens_first

    scores = torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4)  # (slots, positions, tokens)
    laid = tokens_first(scores)
    assert laid.shape == (4, 3, 2) and laid.dtype == torch.float64
    assert all(laid[j, i, s] == scores[s, i, j] for s in range(2) for i in range(3) for j in range(4))
    decoder = decoder_layout(scores[0], cells=[1, 2], tokens=4)  # tokens 2 and 3 predicted at positions 1 and 2
    assert decoder.shape == (4, 2) and decoder.dtype == torch.float64
    assert decoder[:2, 0].tolist() == [scores[0, 1, 0], scores[0, 1, 1]] and decoder[2:, 0].isnan().all()
    assert decoder[:3, 1].tolist() == scores[0, 2, :3].tolist() and decoder[3, 1].isnan()


def test_each_front_end_says_which_word_each_source_position_belongs_to():
    """The evaluation protocols read words through the front end: an encoder's tokens by the tokenizer's offsets
    (special tokens in none), a speech model's units by the alignment (silences and padding in none)."""
    from inseq_mixing.testing import speech_processor, synthetic_audio

    front = inseq_mixing.load_model(tiny_encoder("bert", "masked_lm"), "alti", tokenizer=encoder_tokenizer())
    sequence = front.attribute("the cat [MASK] on the mat", show_progress=False).sequence_attributions[0]
    assert [token.token for token in sequence.source][0] == "[CLS]"
    assert front.source_words(sequence, "the cat [MASK] on the mat") == [-1, 0, 1, 2, 3, 4, 5, -1]
    speech = inseq_mixing.load_model(tiny_speech("wav2vec2"), "alti", processor=speech_processor("wav2vec2"))
    words = [("the", 0.1, 0.2), ("cat", 0.3, 0.4), ("the", 0.45, 0.55)]
    sequence = speech.attribute(synthetic_audio(0.6), words=words, show_progress=False).sequence_attributions[0]
    labels = [token.token for token in sequence.source]
    assert labels[0].startswith("[sil") and len(labels) == 7
    assert speech.source_words(sequence, "the cat the") == [-1, 0, -1, 1, -1, 2, -1]


def test_inseq_load_model_names_the_plugins_loader_for_encoders_and_speech(tmp_path):
    """After ``import inseq_mixing``, Inseq's own loader refuses an encoder-only folder or a speech model object in
    one line naming ``inseq_mixing.load_model`` (Inseq alone fails deep inside); generation models load as before."""
    import inseq

    folder = tmp_path / "bert"
    tiny_encoder("bert", "masked_lm").save_pretrained(folder)
    encoder_tokenizer().save_pretrained(folder)
    hint = r"an encoder-only model \(bert\): use inseq_mixing.load_model\(model, 'alti', tokenizer=\.\.\.\)"
    with pytest.raises(ValueError, match=hint):
        inseq.load_model(str(folder), "alti")
    with pytest.raises(ValueError, match=r"a speech model \(whisper\).*processor=\.\.\."):
        inseq.models.load_model(tiny_speech("whisper"), "value_zeroing")
    model = inseq.load_model(tiny_model("gpt2"), "alti", tokenizer=word_tokenizer(seq2seq=False))
    assert model.attribute("the cat", "the cat sat", show_progress=False).sequence_attributions
