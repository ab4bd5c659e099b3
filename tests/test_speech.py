"""Speech models (Whisper, wav2vec 2.0 post-LN / group norm / stable layer norm, HuBERT) on synthetic audio through
``inseq_mixing.load_model(...).attribute(audio, words=...)``: unit scores against frame-level scores summed by hand,
completeness against the model's own logits, value zeroing against zeroing a unit's values through a hook on the real
module, batches of different lengths against each utterance alone, audio files, and the errors a user meets."""

import dataclasses
import functools
import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import inseq_mixing
from inseq_mixing.declarations import DECLARATIONS
from inseq_mixing.frontends.audio import AudioError, audio_units
from inseq_mixing.frontends.speech import CallSettings, Utterance
from inseq_mixing.testing import (
    LOGIT_METHODS,
    SAMPLING_RATE,
    SPEECH_FAMILIES,
    speech_processor,
    synthetic_audio,
    tiny_speech,
)

AUDIO = (synthetic_audio(0.7), synthetic_audio(0.46, seed=1, tone_hz=330.0))
WORDS = ([("the", 0.1, 0.3), ("cat", 0.32, 0.61)], [("dog", 0.05, 0.2), ("sat", 0.2, 0.4)])
TEXTS = ("the cat sat", "a dog")


@functools.cache
def speech(family: str, head: bool = True):
    return tiny_speech(family, head=head), speech_processor(family)


def attribution_model(family: str, method: str, head: bool = True):
    model, processor = speech(family, head)
    return inseq_mixing.load_model(model, method, processor=processor)


def targets_of(family: str, count: int = 2):
    return list(TEXTS[:count]) if family == "whisper" else None


def run(family: str, method: str, audio=AUDIO, words=WORDS, **options):
    targets = targets_of(family, len(audio))
    return attribution_model(family, method).attribute(list(audio), targets, words=list(words), show_progress=False,
                                                       **options)  # fmt: skip


@pytest.fixture(params=SPEECH_FAMILIES)
def family(request):
    return request.param


def unit_spans(family: str, row: int, words=WORDS) -> list[tuple[int, int]]:
    model, processor = speech(family)
    frames = 50 if family == "whisper" else int(model._get_feat_extract_output_lengths(len(AUDIO[row])))
    real = int(np.ceil(len(AUDIO[row]) / SAMPLING_RATE / 0.02 - 1e-9)) if family == "whisper" else frames
    units = audio_units(len(AUDIO[row]) / SAMPLING_RATE, 0.02, real, frames, words[row] if words else None)
    return [(unit.start, unit.stop) for unit in units]


# ----- units -----


def test_units_of_an_alignment_are_the_frames_whose_centres_fall_in_each_word():
    units = audio_units(1.0, 0.02, 50, 60, [("hello", 0.1, 0.4), ("x", 0.405, 0.41), ("world", 0.5, 0.9)])
    # frame k's centre is 0.02 k + 0.01: "hello" holds k = 5..19, "x" (shorter than a frame) the frame of its
    # midpoint (20), silences the rest, Whisper's padding frames 50..59
    assert [(u.label, u.kind, u.start, u.stop) for u in units] == [
        ("[sil 0.00-0.10s]", "silence", 0, 5),
        ("hello", "word", 5, 20),
        ("x", "word", 20, 21),
        ("[sil 0.42-0.50s]", "silence", 21, 25),
        ("world", "word", 25, 45),
        ("[sil 0.90-1.00s]", "silence", 45, 50),
        ("[pad 1.00-1.20s]", "padding", 50, 60),
    ]


def test_windows_cover_every_frame_once():
    units = audio_units(0.97, 0.02, 49, 49, None, window_s=0.3)
    assert [(u.start, u.stop) for u in units] == [(0, 15), (15, 30), (30, 45), (45, 49)]
    assert units[-1].label == "0.90-0.97s"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ([("a", 0.1, 0.3), ("b", 0.25, 0.4)], "overlap"),
        ([("a", 0.1, 2.5)], "after the audio's end"),
        ([("a", 0.3, 0.1)], "need 0 <= start < end"),
        ([("a", 0.1)], "is not (word, start_s, end_s)"),
        ([("a", 0.1, 0.315), ("b", 0.315, 0.318)], "shorter than a frame"),
    ],
)
def test_bad_word_intervals_are_refused_naming_the_item(words, message):
    model = attribution_model("wav2vec2", "alti")
    with pytest.raises(AudioError, match=re.escape(message)) as error:
        model.attribute(list(AUDIO), words=[WORDS[0], words], show_progress=False)
    assert "Audio 1" in str(error.value)


# ----- pooling, completeness -----


def frame_and_unit_results(family: str, method: str, **options):
    """The method's frame-level result and the pooled one, on the same traced batch."""
    model = attribution_model(family, method)
    signals = list(AUDIO)
    targets = [None, None] if family != "whisper" else list(TEXTS)
    items = [Utterance(*entry) for entry in zip(signals, targets, list(WORDS), ["Audio 0", "Audio 1"], strict=True)]
    batch = model.prepare(items, CallSettings(window_s=0.5, prompt_ids=None, max_new_tokens=8))
    request = batch.request
    parsed = model.declaration.make_options(options)
    pooled = model.declaration.run(request, parsed)
    frames = model.declaration.compute(dataclasses.replace(request, units=None), parsed)
    return batch, frames, pooled


@pytest.mark.parametrize("method", [name for name in DECLARATIONS if name != "value_zeroing"])
def test_unit_scores_are_the_sums_of_their_frames_scores(family, method):
    batch, frames, pooled = frame_and_unit_results(family, method)
    whisper = family == "whisper"
    keyed_frames = frames.source if whisper else frames.target
    keyed_units = pooled.source if whisper else pooled.target
    for row in range(2):
        for number, (start, stop) in enumerate(unit_spans(family, row)):
            expected = keyed_frames[row][..., start:stop].sum(-1)
            torch.testing.assert_close(keyed_units[row][..., number], expected, rtol=1e-5, atol=1e-6)
        if getattr(frames, "encoder", None) is not None or (not whisper and hasattr(pooled, "encoder")):
            square = frames.encoder if whisper else frames.target
            if square is None or getattr(pooled, "encoder", None) is None:
                continue
            units = unit_spans(family, row)
            for i, (qi, qj) in enumerate(units):
                for j, (ki, kj) in enumerate(units):
                    expected = square[row][..., qi:qj, ki:kj].sum(-1).mean(-1)
                    torch.testing.assert_close(pooled.encoder[row][..., i, j], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_logit_methods_add_up_to_the_models_own_logit(family, method):
    out = run(family, method)
    model, processor = speech(family)
    for row, seq in enumerate(out.sequence_attributions):
        total = seq.source_attributions.sum(0)
        if seq.target_attributions is not None:
            total = total + seq.target_attributions.nan_to_num().sum(0)
        terms = sum(value for name, value in seq.step_scores.items() if name.startswith("unattributed_"))
        own = own_logits(family, row, seq)
        torch.testing.assert_close(seq.step_scores["logit"], own, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(total + terms, own, rtol=1e-4, atol=1e-4)


def own_logits(family: str, row: int, seq) -> torch.Tensor:
    """The explained logits from an independent forward pass of the utterance alone."""
    model, processor = speech(family)
    with torch.no_grad():
        if family == "whisper":
            features = processor.feature_extractor(AUDIO[row], sampling_rate=SAMPLING_RATE, return_tensors="pt")
            ids = torch.tensor([[token.id for token in seq.target]])
            logits = model(input_features=features.input_features, decoder_input_ids=ids[:, :-1]).logits[0]
            positions = torch.arange(seq.attr_pos_start - 1, seq.attr_pos_end - 1)
            return logits[positions, ids[0, positions + 1]]
        values = processor.feature_extractor(AUDIO[row], sampling_rate=SAMPLING_RATE, return_tensors="pt")
        logits = model(input_values=values.input_values).logits[0]
        frames = [round(float(token.token.rsplit("@", 1)[1][:-1]) / 0.02) for token in seq.target]
        return logits[frames, [token.id for token in seq.target]]


def test_map_rows_over_units_sum_to_one(family):
    for method in ("alti", "value_zeroing", "attention_rollout"):
        out = run(family, method)
        for seq in out.sequence_attributions:
            encoder = seq.sequence_scores["encoder_self_scores"]
            torch.testing.assert_close(encoder.sum(0), torch.ones_like(encoder.sum(0)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("bias", ["separate", "absdot"])
def test_decompx_over_unit_components(family, bias):
    """One component per unit from the first block: the frame decomposition summed per unit when biases are kept
    apart; complete with every bias split."""
    frames = run(family, "decompx", bias=bias)
    units = run(family, "decompx", bias=bias, unit_components=True)
    for by_frames, by_units in zip(frames.sequence_attributions, units.sequence_attributions, strict=True):
        if bias == "separate":
            torch.testing.assert_close(by_units.source_attributions, by_frames.source_attributions, atol=1e-5,
                                       rtol=1e-4)  # fmt: skip
        total = by_units.source_attributions.sum(0) + sum(
            value for name, value in by_units.step_scores.items() if name.startswith("unattributed_")
        )
        if by_units.target_attributions is not None:
            total = total + by_units.target_attributions.nan_to_num().sum(0)
        torch.testing.assert_close(total, by_units.step_scores["logit"], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="convention='paper'"):
        run(family, "decompx", convention="reference", unit_components=True)


# ----- value zeroing against the definition -----


def zeroed_layer_output(model, call_kwargs, layer, value_proj, frames: list[int]) -> torch.Tensor:
    """Run the model with the value vectors of ``frames`` zeroed in one attention module (a hook on its value
    projection) and return that layer's output; the layers below are untouched, so the layer reads its clean input."""
    recorded = {}

    def zero(_module, _args, output):
        output = output.clone()
        output[:, frames] = 0
        return output

    def keep(_module, _args, output):
        recorded["output"] = output[0] if isinstance(output, tuple) else output

    handles = [value_proj.register_forward_hook(zero), layer.register_forward_hook(keep)]
    try:
        with torch.no_grad():
            model(**call_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return recorded["output"][0]


def cosine_distance(a, b):
    return 1 - F.cosine_similarity(a.double(), b.double(), dim=-1)


@pytest.mark.parametrize("unit_rows", ["mean", "max"])
def test_value_zeroing_equals_zeroing_each_units_values_through_a_hook(family, unit_rows):
    model, processor = speech(family)
    row = 1
    out = run(family, "value_zeroing", unit_rows=unit_rows, per_layer=True)
    seq = out.sequence_attributions[row]
    units = unit_spans(family, row)
    whisper = family == "whisper"
    if whisper:
        features = processor.feature_extractor(AUDIO[row], sampling_rate=SAMPLING_RATE, return_tensors="pt")
        ids = torch.tensor([[token.id for token in seq.target]])
        kwargs = {"input_features": features.input_features, "decoder_input_ids": ids[:, :-1]}
        encoder_layers, decoder_layers = model.model.encoder.layers, model.model.decoder.layers
    else:
        values = processor.feature_extractor(AUDIO[row], sampling_rate=SAMPLING_RATE, return_tensors="pt")
        kwargs = {"input_values": values.input_values}
        encoder_layers = model.base_model.encoder.layers
    for index, layer in enumerate(encoder_layers):
        value_proj = layer.self_attn.v_proj if whisper else layer.attention.v_proj
        clean = zeroed_layer_output(model, kwargs, layer, value_proj, [])
        per_frame = torch.stack(
            [
                cosine_distance(zeroed_layer_output(model, kwargs, layer, value_proj, list(range(a, b))), clean)
                for a, b in units
            ],
            dim=-1,
        )  # fmt: skip  (frames, units)
        reduce = (lambda x: x.mean(0)) if unit_rows == "mean" else (lambda x: x.max(0).values)
        rows = torch.stack([reduce(per_frame[a:b]) for a, b in units])
        expected = rows / rows.sum(-1, keepdim=True)
        got = seq.sequence_scores["encoder_self_scores"][..., index].T  # (query units, key units)
        torch.testing.assert_close(got.double(), expected, rtol=2e-4, atol=2e-5)
        if not whisper:  # the explained frames' rows: each frame's own distances
            frames = [round(float(token.token.rsplit("@", 1)[1][:-1]) / 0.02) for token in seq.target]
            expected = per_frame[frames] / per_frame[frames].sum(-1, keepdim=True)
            torch.testing.assert_close(seq.source_attributions[..., index].T.double(), expected, rtol=2e-4,
                                       atol=2e-5)  # fmt: skip
    if whisper:  # cross-attention: zero a unit's encoder values in one decoder layer, read that layer's output
        first, last = seq.attr_pos_start - 1, seq.attr_pos_end - 1
        for index, layer in enumerate(decoder_layers):
            value_proj = layer.encoder_attn.v_proj
            clean = zeroed_layer_output(model, kwargs, layer, value_proj, [])
            distances = torch.stack(
                [cosine_distance(zeroed_layer_output(model, kwargs, layer, value_proj, list(range(a, b))), clean)
                 for a, b in units], dim=-1)[first:last]  # fmt: skip
            expected = distances / distances.sum(-1, keepdim=True)
            torch.testing.assert_close(seq.source_attributions[..., index].T.double(), expected, rtol=2e-4,
                                       atol=2e-5)  # fmt: skip


# ----- batches, files, outputs -----


@pytest.mark.parametrize("method", ["alti_logit", "value_zeroing", "globenc"])
def test_a_batch_of_different_lengths_equals_each_utterance_alone(family, method):
    together = run(family, method)
    for row in range(2):
        alone = attribution_model(family, method).attribute(
            AUDIO[row], TEXTS[row] if family == "whisper" else None, words=WORDS[row], show_progress=False
        )
        one, other = together.sequence_attributions[row], alone.sequence_attributions[0]
        assert [token.token for token in one.source] == [token.token for token in other.source]
        assert [token.token for token in one.target] == [token.token for token in other.target]
        torch.testing.assert_close(one.source_attributions, other.source_attributions, rtol=1e-4, atol=1e-5)


def test_files_are_read_resampled_and_mixed_down(tmp_path):
    import soundfile

    signal = AUDIO[0]
    soundfile.write(tmp_path / "same.wav", signal, SAMPLING_RATE, subtype="FLOAT")
    soundfile.write(tmp_path / "stereo.flac", np.stack([signal, signal], axis=1), SAMPLING_RATE, subtype="PCM_24")
    half = signal[::2].copy()
    soundfile.write(tmp_path / "half.wav", half, SAMPLING_RATE // 2, subtype="FLOAT")
    model = attribution_model("wav2vec2", "alti")
    from_array = model.attribute(signal, words=WORDS[0], show_progress=False).sequence_attributions[0]
    from_file = model.attribute(str(tmp_path / "same.wav"), words=WORDS[0], show_progress=False)
    torch.testing.assert_close(from_file.sequence_attributions[0].source_attributions, from_array.source_attributions)
    flac = model.attribute(str(tmp_path / "stereo.flac"), words=WORDS[0], show_progress=False).sequence_attributions[0]
    torch.testing.assert_close(flac.source_attributions, from_array.source_attributions, rtol=1e-3, atol=1e-3)
    from inseq_mixing.frontends.audio import read_audio

    assert len(read_audio(str(tmp_path / "half.wav"), SAMPLING_RATE)) == 2 * len(half)


def test_unreadable_and_wrong_audio_get_clear_errors(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    model = attribution_model("wav2vec2", "alti")
    with pytest.raises(AudioError, match="Audio 1: cannot read"):
        model.attribute([AUDIO[0], str(bad)], show_progress=False)
    with pytest.raises(AudioError, match="Audio 0 has shape"):
        model.attribute([np.zeros((2, 100), dtype=np.float32)], show_progress=False)
    with pytest.raises(AudioError, match="NaN"):
        model.attribute(np.full(1000, np.nan, dtype=np.float32), show_progress=False)
    with pytest.raises(AudioError, match="Whisper reads 1s at a time"):
        attribution_model("whisper", "alti").attribute(synthetic_audio(1.5), "the cat", show_progress=False)


def test_refusals_name_what_to_do():
    model, processor = speech("wav2vec2", head=False)
    with pytest.raises(ValueError, match="bare encoder"):
        inseq_mixing.load_model(model, "alti_logit", processor=processor)
    with pytest.raises(ValueError, match="gradient methods"):
        inseq_mixing.load_model(speech("whisper")[0], "integrated_gradients", processor=speech("whisper")[1])
    with pytest.raises(ValueError, match="processor"):
        inseq_mixing.load_model(speech("whisper")[0], "alti")


def saved_speech(family: str, folder) -> str:
    """A tiny speech model saved with its feature extractor and tokenizer, as a user's checkpoint folder."""
    model, processor = speech(family)
    model.save_pretrained(folder)
    processor.feature_extractor.save_pretrained(folder)
    processor.tokenizer.save_pretrained(folder)
    return str(folder)


def corpus(tmp_path, count: int) -> list[dict]:
    """Utterances of different lengths as WAV files: some with a forced alignment, some with a transcript."""
    import soundfile

    rows = []
    for index in range(count):
        seconds = 0.45 + 0.05 * (index % 5)
        path = tmp_path / f"u{index}.wav"
        soundfile.write(path, synthetic_audio(seconds, seed=index, tone_hz=180.0 + 20 * index), SAMPLING_RATE)
        row = {"id": f"u{index}", "audio": str(path)}
        if index % 3 != 2:
            row["words"] = json.dumps([["the", 0.05, 0.2], ["cat", 0.22, 0.4]])
        if index % 2 == 0:
            row["transcript"] = "the cat"
        rows.append(row)
    return rows


def alone(model, row, **kwargs):
    """What ``.attribute`` gives one stored row's utterance alone."""
    words = json.loads(row["words"]) if "words" in row else None
    transcript = row.get("transcript") if model.whisper else None
    output = model.attribute(row["audio"], transcript, words=words, show_progress=False, **kwargs)
    return output.sequence_attributions[0]


def assert_same_sequence(stored, own):
    assert [token.token for token in stored.source] == [token.token for token in own.source]
    assert [token.id for token in stored.target] == [token.id for token in own.target]
    torch.testing.assert_close(stored.source_attributions, own.source_attributions, atol=2e-5, rtol=1e-4)
    for name, scores in own.sequence_scores.items():
        torch.testing.assert_close(stored.sequence_scores[name], scores, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("family", "method"), [("whisper", "alti_logit"), ("hubert", "value_zeroing")])
def test_a_dataset_run_of_a_speech_corpus_stores_what_attribute_gives_each_utterance_alone(family, method, tmp_path):
    """Rows of audio files (with and without a forced alignment, with and without a transcript) in padded batches:
    each stored example, per unit, is ``.attribute`` on that utterance alone; the manifest names the front end's
    arguments."""
    rows = corpus(tmp_path, 5)
    model, processor = speech(family)
    summary = inseq_mixing.attribute_dataset(model, method, rows, tmp_path / "run", processor=processor,
                                             batch_size=2, id_column="id", window_s=0.2, max_new_tokens=4,
                                             show_progress=False)  # fmt: skip
    assert summary.attributed == 5
    run = inseq_mixing.load_run(tmp_path / "run")
    assert run.manifest["options"]["window_s"] == 0.2
    front = attribution_model(family, method)
    for row in rows:
        assert_same_sequence(run[row["id"]], alone(front, row, window_s=0.2, max_new_tokens=4))
    units = [token.token for token in run["u2"].source]  # no alignment: windows of 0.2 s
    assert units[0] == "0.00-0.20s" and "the" in [token.token for token in run["u0"].source]


def test_a_killed_speech_run_resumes_with_nothing_lost(tmp_path):
    """The command line on a saved speech model: killed (SIGKILL) after some shards, resumed with the same command,
    every example stored once and equal to ``.attribute`` alone."""
    folder = saved_speech("wav2vec2", tmp_path / "w2v")
    rows = corpus(tmp_path, 30)
    data = tmp_path / "corpus.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "inseq_mixing.cli", "attribute-dataset", str(data), "--model", folder,
               "--method", "alti", "--id-column", "id", "--batch-size", "1", "--out", str(out)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and len(list((out / "shards").glob("batch-*.json"))) < 2:
        time.sleep(0.01)
    process.kill()
    _, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, err[-2000:]
    stored = len(inseq_mixing.load_run(out))
    assert 2 <= stored < len(rows), "the kill must land mid-run"
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{stored} already stored" in resumed.stdout
    run = inseq_mixing.load_run(out)
    assert run.complete and sorted(run.ids()) == sorted(row["id"] for row in rows)
    front = attribution_model("wav2vec2", "alti")
    for row in rows:
        assert_same_sequence(run[row["id"]], alone(front, row))


def test_bad_speech_rows_are_named_before_any_work(tmp_path):
    rows = corpus(tmp_path, 3)
    rows[2]["words"] = json.dumps([["cat", 0.3, 0.2]])
    model, processor = speech("hubert")
    with pytest.raises(ValueError, match=r"Row 2 \(id 'u2'\): word 'cat' has the interval 0.3-0.2s"):
        inseq_mixing.attribute_dataset(model, "alti", rows, tmp_path / "run", processor=processor, id_column="id",
                                       show_progress=False)  # fmt: skip
    rows[2].update(words=None, frames="7 999")
    with pytest.raises(ValueError, match=r"Row 2 \(id 'u2'\) has \d+ frames: frames \[999\] are outside it"):
        inseq_mixing.attribute_dataset(model, "alti", rows, tmp_path / "run", processor=processor, id_column="id",
                                       show_progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="processor"):
        inseq_mixing.attribute_dataset(model, "alti", rows, tmp_path / "run", show_progress=False)


@pytest.mark.parametrize("head", [True, False])
def test_value_zeroing_rolls_out_ctc_and_bare_encoders_over_units(head):
    """With ``rollout=True`` the unit map is rolled out through the layers below the last, and the explained frames'
    rows of the last layer (over units) enter it: rows sum to 1 and equal that product of the per-layer output."""
    model, processor = speech("wav2vec2", head)
    front = inseq_mixing.load_model(model, "value_zeroing", processor=processor)
    kwargs = {"words": [WORDS[0]], "show_progress": False}
    layers = front.attribute([AUDIO[0]], per_layer=True, **kwargs).sequence_attributions[0]
    rolled = front.attribute([AUDIO[0]], rollout=True, **kwargs).sequence_attributions[0]
    units = layers.sequence_scores["encoder_self_scores"].permute(2, 1, 0)  # (layers, query units, key units)
    below = units[0]
    for layer in range(1, units.shape[0] - 1):
        below = units[layer] @ below
    frames = layers.source_attributions[..., -1].T  # the last layer's explained frames over units
    torch.testing.assert_close(rolled.source_attributions.T, frames @ below, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(rolled.sequence_scores["encoder_self_scores"].T, units[-1] @ below)
    sums = rolled.source_attributions.sum(0)
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def test_audio_shorter_than_one_frame_is_refused_alone_and_in_a_batch():
    """The fewest samples are the feature encoder's receptive field: one fewer makes no frame in transformers."""
    model, processor = speech("wav2vec2")
    front = attribution_model("wav2vec2", "alti")
    shortest = front.shortest_samples
    lengths = model._get_feat_extract_output_lengths(torch.tensor([shortest - 1, shortest]))
    assert lengths.tolist() == [0, 1]
    short = synthetic_audio(1.0)[: shortest - 1]
    for audio in ([short], [AUDIO[0], short]):
        message = rf"Audio {len(audio) - 1} has {shortest - 1} samples.*at least {shortest}"
        with pytest.raises(AudioError, match=message):
            front.attribute(audio, show_progress=False)
    front.attribute([synthetic_audio(1.0)[:shortest]], targets=[[0]], show_progress=False)  # one frame: works


def test_speech_inputs_refused_before_any_work():
    front = attribution_model("wav2vec2", "alti_logit")
    with pytest.raises(ValueError, match="batch_size must be a positive integer, not 0"):
        front.attribute([AUDIO[0]], batch_size=0, show_progress=False)
    with pytest.raises(ValueError, match="contrast_targets: speech models explain"):
        front.attribute([AUDIO[0]], contrast_targets="a", show_progress=False)
    frames = front.attribute(AUDIO[0], targets=np.array([1, 3]), show_progress=False).sequence_attributions[0]
    assert frames.source_attributions.shape[1] == 2
    with pytest.raises(ValueError, match="unit_components") as refused:
        attribution_model("wav2vec2", "decompx").attribute(
            AUDIO[0], convention="reference", unit_components=True, show_progress=False
        )
    assert "units_as_components" not in str(refused.value)


def test_speech_evaluation_keeps_going_past_a_row_it_cannot_use(tmp_path):
    """A target followed by punctuation in the transcript is the same word, as in the text protocols; a row whose
    target is not in its transcript is skipped with the reason, before any work, and the other rows are scored."""
    rows = speech_rows(tmp_path, 3)
    rows[0]["transcript"] = "The cat sat, on"
    rows[1]["transcript"] = "the cat on"
    result = inseq_mixing.evaluate(attribution_model("whisper", "alti"), ["alti"], rows, "cue", draws=10)
    assert [skip.row for skip in result.skipped] == [1] and "'sat' is not a word of the transcript" in (
        result.skipped[0].reason
    )
    assert result.method_summary("alti")["n"] == 2


def test_whisper_explains_its_greedy_transcript_by_default():
    out = attribution_model("whisper", "alti_logit").attribute(AUDIO[0], show_progress=False, max_new_tokens=5)
    seq = out.sequence_attributions[0]
    own = own_logits("whisper", 0, seq)
    model, processor = speech("whisper")
    features = processor.feature_extractor(AUDIO[0], sampling_rate=SAMPLING_RATE, return_tensors="pt")
    ids = torch.tensor([[token.id for token in seq.target]])
    with torch.no_grad():
        logits = model(input_features=features.input_features, decoder_input_ids=ids[:, :-1]).logits[0]
    best = logits[seq.attr_pos_start - 1 : seq.attr_pos_end - 1].max(-1).values
    torch.testing.assert_close(own, best)  # each explained token is the model's top prediction
    assert 1 <= len(seq.target) - seq.attr_pos_start <= 5


@pytest.mark.parametrize("family", ["whisper", "hubert"])
def test_bare_encoders_give_the_map_methods(family):
    model, processor = speech(family, head=False)
    out = inseq_mixing.load_model(model, "alti", processor=processor).attribute(
        AUDIO[0], words=WORDS[0], show_progress=False
    )
    seq = out.sequence_attributions[0]
    units = seq.sequence_scores["encoder_self_scores"]
    assert units.shape[0] == units.shape[1] == len(seq.source)
    assert seq.source_attributions.shape[1] == len(seq.target)  # every frame is a row by default


def test_windows_show_save_and_load(family, tmp_path):
    import inseq

    out = attribution_model(family, "alti").attribute(list(AUDIO), targets_of(family), window_s=0.3,
                                                      show_progress=False)  # fmt: skip
    out.save(tmp_path / "out.json")
    loaded = inseq.FeatureAttributionOutput.load(tmp_path / "out.json")
    torch.testing.assert_close(
        loaded.sequence_attributions[1].source_attributions, out.sequence_attributions[1].source_attributions
    )
    labels = [token.token for token in out.sequence_attributions[0].source]
    assert labels[:2] == ["0.00-0.30s", "0.30-0.60s"]
    html = out.show(display=False, return_html=True)
    assert "0.30-0.60s" in html


# ----- the speech study's protocols -----


def speech_rows(tmp_path, count: int = 3) -> list[dict]:
    import soundfile

    rows = []
    for index in range(count):
        path = tmp_path / f"utterance{index}.flac"
        soundfile.write(path, synthetic_audio(0.9, seed=index, tone_hz=200.0 + 40 * index), SAMPLING_RATE)
        words = [["the", 0.05, 0.2], ["cat", 0.22, 0.4], ["sat", 0.42, 0.6], ["on", 0.62, 0.85]]
        rows.append({"audio": str(path), "words": words, "target": "sat", "cues": ["cat"],
                     "transcript": "the cat sat on"})  # fmt: skip
    return rows


def test_speech_cue_shares_and_random_baseline(tmp_path):
    from inseq_mixing.evaluation.metrics import cue_share

    rows = speech_rows(tmp_path)
    model = attribution_model("whisper", "alti")
    result = inseq_mixing.evaluate(model, ["alti", "value_zeroing"], rows, "cue", random_baseline=True, draws=20)
    assert set(result.results) == {"alti", "value_zeroing", "alti (random init)", "value_zeroing (random init)"}
    models = {row["method"]: row.get("model") for row in result.summary_rows()}  # said to be another model
    assert models["alti (random init)"] == "random init (another model)" and models["alti"] == "as given"
    assert any("randomly initialised copy of the model: another model" in note for note in result.notes())
    assert result.metrics == ("cue_contribution", "text_cue_contribution")
    summary = result.method_summary("value_zeroing")  # per layer; alti is rolled out (one total)
    assert len(summary["per_layer"]) == 2 and summary["n"] == 3
    # the audio cue share of the first row, recomputed from the method's own output
    seq = model.attribute(str(rows[0]["audio"]), "the cat sat on", words=[tuple(w) for w in rows[0]["words"]],
                          show_progress=False).sequence_attributions[0]  # fmt: skip
    words = [i for i, token in enumerate(seq.source) if token.token in ("the", "cat", "sat", "on")]
    share = cue_share(seq.source_attributions[words, 2], [1])  # "sat" is the third transcript token
    torch.testing.assert_close(result.results["alti"].statistics["cue_contribution"].num[0], share.mean().double())
    assert result.baseline["cue_contribution"] == pytest.approx(1 / 4)
    text = result.results["alti"].statistics["text_cue_contribution"]
    assert bool((text.den == 1).all()) and bool(((text.num >= 0) & (text.num <= 1)).all())


def test_ctc_cue_reads_the_target_words_row_of_the_unit_map(tmp_path):
    rows = speech_rows(tmp_path, 2)
    result = inseq_mixing.evaluate(attribution_model("hubert", "alti"), ["alti", "globenc"], rows, "cue", draws=10)
    assert result.metrics == ("cue_contribution",)
    assert 0 <= result.method_summary("globenc")["cue_contribution"] <= 1


def test_blankout_measures_the_probability_drops(tmp_path):
    rows = speech_rows(tmp_path, 2)
    model = attribution_model("whisper", "alti")
    result = inseq_mixing.evaluate(model, ["alti"], rows, "blankout", draws=10)
    drops = result.results["model"].statistics
    # recomputed: the probability of "sat" after "the cat" with and without the cue's audio
    from inseq_mixing.frontends.audio import read_audio

    whisper, processor = speech("whisper")
    signal = read_audio(rows[0]["audio"], SAMPLING_RATE)
    ids = [3] + processor.tokenizer("the cat sat on", add_special_tokens=False).input_ids

    def probability(audio, decoder):
        features = processor.feature_extractor(audio, sampling_rate=SAMPLING_RATE, return_tensors="pt")
        with torch.no_grad():
            logits = whisper(input_features=features.input_features, decoder_input_ids=torch.tensor([decoder])).logits
        return float(logits[0, -1].softmax(-1)[ids[3]])

    silenced = signal.copy()
    silenced[int(0.22 * SAMPLING_RATE) : int(0.4 * SAMPLING_RATE)] = 0
    expected = probability(signal, ids[:3]) - probability(silenced, ids[:3])
    assert float(drops["audio_cue_drop"].num[0]) == pytest.approx(expected, rel=1e-4, abs=1e-7)
    unk = processor.tokenizer.unk_token_id
    expected_text = probability(signal, ids[:3]) - probability(signal, [ids[0], ids[1], unk])
    assert float(drops["text_cue_drop"].num[0]) == pytest.approx(expected_text, rel=1e-4, abs=1e-7)
    # the cue words' silence is tested against the random word's (the study's control), on the rows with one
    (pair,) = result.pairs()
    assert (pair["method_a"], pair["method_b"]) == ("audio_cue_drop", "audio_random_drop")
    both = drops["audio_random_drop"].den > 0
    cue, control = drops["audio_cue_drop"].num[both], drops["audio_random_drop"].num[both]
    assert pair["difference"] == pytest.approx(float(cue.mean() - control.mean())) and 0 < pair["p_value"] <= 1
    assert {"audio_cue_drop", "audio_random_drop", "text_cue_drop"} <= set(result.summary_rows()[0])
    with pytest.raises(Exception, match="needs Whisper"):
        inseq_mixing.evaluate(attribution_model("hubert", "alti"), ["alti"], rows, "blankout")


def test_speech_evaluation_from_the_command_line(tmp_path):
    import json

    from inseq_mixing.cli import main

    whisper, processor = speech("whisper")
    folder = tmp_path / "whisper"
    whisper.save_pretrained(folder)
    processor.feature_extractor.save_pretrained(folder)
    processor.tokenizer.save_pretrained(folder)
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in speech_rows(tmp_path, 2)))
    out, metrics = tmp_path / "cue.html", tmp_path / "cue.json"
    code = main(
        [
            "evaluate",
            str(data),
            "--model",
            str(folder),
            "--protocol",
            "cue",
            "--methods",
            "alti",
            "value_zeroing",
            "--random-baseline",
            "--out",
            str(out),
            "--json",
            str(metrics),
            "--draws",
            "10",
        ]
    )
    assert code == 0 and out.exists()
    saved = json.loads(metrics.read_text())
    assert set(saved["methods"]) == {"alti", "value_zeroing", "alti (random init)", "value_zeroing (random init)"}
    code = main(["evaluate", str(data), "--model", str(folder), "--protocol", "blankout", "--methods", "alti",
                 "--out", str(tmp_path / "blank.html"), "--draws", "10"])  # fmt: skip
    assert code == 0 and (tmp_path / "blank.html").exists()


def test_the_speech_example_runs_end_to_end(tmp_path, capsys):
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).parent.parent / "examples" / "speech.py"
    argv = sys.argv
    sys.argv = [str(script), "--out", str(tmp_path / "speech.html")]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    printed = capsys.readouterr().out
    assert "ALTI-logit parts add up to the logit: True" in printed
    assert (tmp_path / "speech.html").stat().st_size > 1000


def test_the_speech_studys_conventions_on_request_against_hidden_states_zeroed_through_hooks():
    """``convention="reference"`` reproduces the speech study's code: a word's frames are ``ceil(50·start)`` to
    ``ceil(50·end)`` inclusive (here "dog" and "sat" share frame 10), and a layer is read from transformers' hidden
    states, whose last entry has the decoder's final norm. Both written here with hooks on the real modules, the whole
    model run once per (layer, unit or token) with that layer's values zeroed."""
    model, processor = speech("whisper")
    row = 1
    out = attribution_model("whisper", "value_zeroing").attribute(
        AUDIO[row], TEXTS[row], words=WORDS[row], show_progress=False, convention="reference", per_layer=True
    )
    seq = out.sequence_attributions[0]
    real = int(np.ceil(len(AUDIO[row]) / SAMPLING_RATE / 0.02 - 1e-9))
    words = [range(int(np.ceil(50 * start)), int(np.ceil(50 * end)) + 1) for _, start, end in WORDS[row]]
    covered = {frame for frames in words for frame in frames}
    silences = [frame for frame in range(real) if frame not in covered]
    assert silences == [0, 1, 2, 21, 22] and words[0][-1] == words[1][0] == 10  # the shared frame
    units = [[0, 1, 2], list(words[0]), list(words[1]), [21, 22], list(range(real, 50))]  # as the output lists them
    assert [token.token for token in seq.source][1:3] == ["dog", "sat"]
    features = processor.feature_extractor(AUDIO[row], sampling_rate=SAMPLING_RATE, return_tensors="pt")
    ids = torch.tensor([[token.id for token in seq.target]])
    kwargs = {"input_features": features.input_features, "decoder_input_ids": ids[:, :-1],
              "output_hidden_states": True}  # fmt: skip

    def hidden(index: int, value_proj, zeroed: list[int]) -> torch.Tensor:
        def zero(_module, _args, output):
            output = output.clone()
            output[:, zeroed] = 0
            return output

        handle = value_proj.register_forward_hook(zero)
        try:
            with torch.no_grad():
                return model(**kwargs).decoder_hidden_states[index + 1][0]  # the last one after the final norm
        finally:
            handle.remove()

    first, last = seq.attr_pos_start - 1, seq.attr_pos_end - 1
    layers = model.model.decoder.layers
    for index, layer in enumerate(layers):
        clean = hidden(index, layer.encoder_attn.v_proj, [])
        cross = torch.stack([cosine_distance(hidden(index, layer.encoder_attn.v_proj, frames), clean)
                             for frames in units], dim=-1)[first:last]  # fmt: skip
        torch.testing.assert_close(seq.source_attributions[..., index].T.double(), cross / cross.sum(-1, keepdim=True),
                                   rtol=2e-4, atol=2e-5)  # fmt: skip
        tokens = ids.shape[1] - 1
        own = torch.stack([cosine_distance(hidden(index, layer.self_attn.v_proj, [token]), clean)
                           for token in range(tokens)], dim=-1)[first:last].tril(first)  # fmt: skip
        torch.testing.assert_close(seq.target_attributions[:tokens, :, index].T.double().nan_to_num(),
                                   own / own.sum(-1, keepdim=True), rtol=2e-4, atol=2e-5)  # fmt: skip
    paper = (
        attribution_model("whisper", "value_zeroing")
        .attribute(AUDIO[row], TEXTS[row], words=WORDS[row], show_progress=False)
        .sequence_attributions[0]
    )
    assert [token.token for token in paper.source] != [token.token for token in seq.source]  # other frames
    with pytest.raises(AssertionError):  # the last layer read without the final norm differs
        torch.testing.assert_close(paper.target_attributions[..., -1], seq.target_attributions[..., -1],
                                   rtol=2e-4, atol=2e-5, equal_nan=True)  # fmt: skip
