"""Faithfulness on speech models (units silenced): the AOPC against its definition computed by hand through the
real Hugging Face modules, and a stored speech run evaluated from its store (``evaluate --run``) as from the model."""

import json
import math

import pytest
import torch

import inseq_mixing
from inseq_mixing.cli import main
from inseq_mixing.evaluation import EvaluationInputError
from inseq_mixing.evaluation.speech_faithfulness import speech_faithfulness
from inseq_mixing.testing import SAMPLING_RATE

from .test_speech import AUDIO, WORDS, attribution_model, corpus, saved_speech, speech
from .test_stored_evaluation import same_scores

FRACTIONS = (0.5, 1.0)


def hand_read(family: str, signal, decoder_ids: list[int] | None, position: int, token: int) -> tuple[float, float]:
    """The explained probability and logit of one signal, read through the processor and the model directly."""
    model, processor = speech(family)
    extractor = processor.feature_extractor
    with torch.no_grad():
        if decoder_ids is not None:
            features = extractor(signal, sampling_rate=SAMPLING_RATE, return_tensors="pt").input_features
            logits = model(input_features=features, decoder_input_ids=torch.tensor([decoder_ids])).logits[0, -1]
        else:
            inputs = extractor(signal, sampling_rate=SAMPLING_RATE, return_tensors="pt", return_attention_mask=True)
            logits = model(input_values=inputs.input_values, attention_mask=inputs.attention_mask).logits[0, position]
    return float(logits.softmax(-1)[token]), float(logits[token])


@pytest.mark.parametrize("family", ["whisper", "wav2vec2"])
def test_speech_faithfulness_is_the_aopc_of_silencing_the_top_units(family):
    """Per explained entry: rank the aligned words by the entry's scores, silence the top half / all of them
    (comprehensiveness) or all the others (sufficiency) sample by sample, read the model on each signal alone, and
    average the drops: what :func:`speech_faithfulness` reports."""
    front = attribution_model(family, "alti_logit")
    signal, words = AUDIO[0], WORDS[0] + [("sat", 0.62, 0.69)]
    whisper = family == "whisper"
    target = "the cat" if whisper else [5, 12, 20, 30]
    sequence = front.attribute(signal, target, words=words, show_progress=False).sequence_attributions[0]
    units = front.units(signal, words, 0.5, "Audio 0")
    assert [unit.kind for unit in units].count("word") == 3 and any(unit.kind == "silence" for unit in units)
    rows = speech_faithfulness(front, [(sequence, signal, units)], FRACTIONS, random_draws=0)
    assert len(rows) == sequence.attr_pos_end - sequence.attr_pos_start
    ids = [token.id for token in sequence.target]
    for column, row in enumerate(rows):
        index = sequence.attr_pos_start + column
        decoder, position = (ids[:index], index - 1) if whisper else (None, target[column])
        token = ids[index]
        scores = sequence.source_attributions[:, column].float()
        words_ranked = sorted((n for n, unit in enumerate(units) if unit.kind == "word"),
                              key=lambda n: -float(scores[n]))  # fmt: skip

        def silenced(numbers):
            copy = signal.copy()
            for n in numbers:
                copy[int(units[n].start_s * SAMPLING_RATE) : int(units[n].end_s * SAMPLING_RATE)] = 0.0
            return copy

        prob, logit = hand_read(family, signal, decoder, position, token)
        expected = {"comprehensiveness_prob": 0.0, "comprehensiveness_logit": 0.0, "sufficiency_prob": 0.0,
                    "sufficiency_logit": 0.0}  # fmt: skip
        for fraction in FRACTIONS:
            top = words_ranked[: math.ceil(fraction * len(words_ranked))]
            rest = [n for n in words_ranked if n not in top]
            for name, numbers in (("comprehensiveness", top), ("sufficiency", rest)):
                p, q = hand_read(family, silenced(numbers), decoder, position, token)
                expected[f"{name}_prob"] += (prob - p) / len(FRACTIONS)
                expected[f"{name}_logit"] += (logit - q) / len(FRACTIONS)
        for name, value in expected.items():
            assert row[name] == pytest.approx(value, abs=2e-5), (column, name)
        assert expected["comprehensiveness_logit"] != pytest.approx(0.0, abs=1e-4)  # silencing changed the model


def test_a_speech_run_is_evaluated_from_its_store_as_from_the_model(tmp_path, capsys):
    """A dataset run of a saved CTC model (rows with and without word intervals) scored from its store equals the
    faithfulness protocol on the model; the command line does it; a moved audio file is named."""
    folder = saved_speech("wav2vec2", tmp_path / "w2v")
    rows = corpus(tmp_path, 4)
    direct = inseq_mixing.evaluate(folder, ["alti"], rows, "faithfulness", draws=50)
    inseq_mixing.attribute_dataset(folder, "alti", rows, tmp_path / "run", id_column="id", batch_size=2,
                                   show_progress=False)  # fmt: skip
    run = inseq_mixing.load_run(tmp_path / "run")
    assert run.inputs("u0")["words"] == json.loads(rows[0]["words"]) and run.inputs("u2")["words"] is None
    entries = sum(len(sequence.target) for sequence in run)  # every explained frame of every row is scored
    assert direct.results["alti"].statistics["comprehensiveness_prob"].num.numel() == entries >= len(rows)
    stored = inseq_mixing.evaluate(tmp_path / "run", draws=50)
    assert list(stored.results) == ["alti"] and stored.protocol == "faithfulness"
    same_scores(stored, direct, "alti")

    metrics = tmp_path / "metrics.json"
    code = main(["evaluate", "--run", str(tmp_path / "run"), "--out", str(tmp_path / "r.html"), "--json",
                 str(metrics), "--draws", "20"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert list(json.loads(metrics.read_text())["methods"]) == ["alti"]

    (tmp_path / "u1.wav").rename(tmp_path / "moved.wav")
    with pytest.raises(EvaluationInputError, match=r"Example 'u1'.*reads its audio files again"):
        inseq_mixing.evaluate(tmp_path / "run")
