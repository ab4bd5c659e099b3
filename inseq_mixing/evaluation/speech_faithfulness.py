"""Faithfulness of unit attributions on speech models: AOPC by silencing units (our extension).

ERASER's comprehensiveness and sufficiency (DeYoung et al., ACL 2020; :mod:`.faithfulness`) are defined on text
tokens. Here the items are an utterance's audio units (the words of a forced alignment, or fixed windows:
:mod:`inseq_mixing.frontends.audio`), and removing a unit is replacing its samples by silence (zeros), as the speech
study's ``blankout`` protocol silences cue words (Mohebbi et al., EMNLP 2023). Silences between words and Whisper's
padding are never ranked or removed. For each explained entry (Whisper: a transcript token, teacher-forced on the
same transcript; CTC models: an explained frame, whose frame count silencing does not change) and the ranking of the
units by the entry's scores (averaged over an extra axis of layers or heads), the top ``k%`` of the units are silenced
(comprehensiveness) or all the others are (sufficiency), and the drop in the entry's probability and logit is
averaged over ``k``; random rankings of the same units are the baseline. Higher comprehensiveness and lower
sufficiency mean a more faithful ranking.

Rows (from the model, :func:`evaluate_speech_faithfulness`): ``audio`` (a WAV/FLAC path), ``words`` (optional: its
forced alignment, a JSON list of ``[word, start_s, end_s]``; without it, windows of ``window_s``), and, for Whisper,
``transcript`` (optional: the text explained; default: the greedy transcript). A stored run of
:func:`~inseq_mixing.attribute_dataset` is evaluated from its store (:mod:`.stored`).
"""

from __future__ import annotations

import json

import numpy as np
import torch

from ..frontends.audio import DEFAULT_WINDOW_S, AudioError, Unit, read_audio
from ..runs.data import read_rows
from .explain import explanations
from .faithfulness import DEFAULT_FRACTIONS, removal_faithfulness
from .items import EvaluationInputError, Skipped
from .scores import Evaluation, faithfulness_baseline, faithfulness_result, score_methods

#: Unit kinds a ranking holds (silences and padding are never removed).
RANKED_KINDS = ("word", "window")
#: Perturbed utterances read per forward pass.
READ_BATCH = 16


def speech_faithfulness(front, explained: list, fractions=DEFAULT_FRACTIONS, random_draws: int = 3, seed: int = 0):
    """AOPC rows of ``front``'s method, one per explained entry of each utterance (see the module docstring).

    Args:
        front: The :class:`~inseq_mixing.frontends.speech.SpeechAttributionModel` whose model is read.
        explained: Per utterance, ``(sequence, signal, units)``: the Inseq sequence the method gave, the signal it
            was given and its :class:`~inseq_mixing.frontends.audio.Unit` list (the sequence's source, in order).
        fractions: The fractions of the ranked units removed or kept.
        random_draws: Random rankings per explained entry.
        seed: Seed of the random rankings.

    Returns:
        One dict per explained entry: ``sentence``, ``position`` and the AOPC metrics with their ``random_*``.
    """
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for sentence, (sequence, signal, units) in enumerate(explained):
        candidates = torch.tensor([unit.kind in RANKED_KINDS for unit in units])
        spans = unit_samples(units, front.sampling_rate)
        scores = sequence.source_attributions.float()
        for column, (position, token) in enumerate(explained_entries(front, sequence)):
            column_scores = scores[:, column]
            column_scores = column_scores.mean(-1) if column_scores.ndim == 2 else column_scores
            read = _reader(front, signal, spans, sequence, position, token)
            row = removal_faithfulness(read, column_scores, candidates, fractions, random_draws, generator)
            rows.append({"sentence": sentence, "position": column, **row})
    return rows


def unit_samples(units: list[Unit], sampling_rate: int) -> list[tuple[int, int]]:
    """Each unit's samples ``[start, stop)``: a word's aligned interval, a window's or silence's frames' time."""
    return [(int(unit.start_s * sampling_rate), int(unit.end_s * sampling_rate)) for unit in units]


def explained_entries(front, sequence) -> list[tuple[int, int]]:
    """Per explained entry of a speech sequence, the position whose logit was explained and the output there:
    Whisper's decoder position (the token before it) and the transcript token; a CTC model's frame and its label's
    output (the frame read back from the label ``"c@0.42s"``, checked to give that label again)."""
    entries = []
    for index in range(sequence.attr_pos_start, sequence.attr_pos_end):
        token = sequence.target[index]
        if front.whisper:
            entries.append((index - 1, token.id))
            continue
        name, _, time = token.token.rpartition("@")
        frame = round(float(time.removesuffix("s")) / front.frame_seconds)
        if f"{name}@{frame * front.frame_seconds:.2f}s" != token.token:
            raise EvaluationInputError(
                f"The explained frame {token.token!r} does not name one frame of this model "
                f"({front.frame_seconds * 1000:.0f} ms per frame): the sequence was made by another model."
            )
        entries.append((frame, token.id))
    return entries


def _reader(front, signal: np.ndarray, spans: list[tuple[int, int]], sequence, position: int, token: int):
    """The explained probability and logit for masks ``(rows, units)`` of the units kept: the signal with every other
    unit's samples silenced, read by the model (Whisper: teacher-forced on the sequence's decoder text up to
    ``position``)."""
    model = front.model
    decoder = None
    if front.whisper:
        decoder = torch.tensor([[token.id for token in sequence.target[: position + 1]]], device=front.device)

    @torch.no_grad()
    def read(kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probabilities, logits = [], []
        for start in range(0, len(kept), READ_BATCH):
            signals = [_silenced(signal, spans, keep) for keep in kept[start : start + READ_BATCH]]
            inputs, _, _ = front.features(signals)
            if decoder is None:
                out = model(**inputs).logits[:, position]
            else:
                ids = decoder.expand(len(signals), -1)
                out = model(**inputs, decoder_input_ids=ids, use_cache=False).logits[:, -1]
            out = out.float().cpu()
            probabilities.append(out.softmax(-1)[:, token])
            logits.append(out[:, token])
        return torch.cat(probabilities), torch.cat(logits)

    return read


def _silenced(signal: np.ndarray, spans: list[tuple[int, int]], keep: torch.Tensor) -> np.ndarray:
    """``signal`` with the samples of every unit not kept replaced by silence."""
    silenced = signal.copy()
    for (start, stop), kept in zip(spans, keep.tolist(), strict=True):
        if not kept:
            silenced[start:stop] = 0.0
    return silenced


def evaluate_speech_faithfulness(
    front,
    methods: list[str],
    data,
    *,
    method_kwargs: dict | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    draws: int = 1000,
    seed: int = 0,
    examples: int = 2,
    random_draws: int = 3,
    show_progress: bool = False,
    columns: dict[str, str] | None = None,
) -> Evaluation:
    """The faithfulness protocol on a speech model (see the module docstring): each method attributes the rows, and
    its rankings are scored by silencing units.

    Args:
        front: The speech front end (any method: each of ``methods`` gets the same model and processor).
        methods: This package's method names.
        data: The rows (JSONL, CSV, Parquet, a DataFrame or dicts).
        method_kwargs: Per method, its options.
        window_s: Window length for rows without ``words``.
        draws: Bootstrap resamples.
        seed: Seed of the resampling and of the random rankings.
        examples: Explanations kept per method for the report.
        random_draws: Random rankings per explained entry.
        show_progress: Show a progress bar over the methods.
        columns: Column names by role (``audio``, ``words``, ``transcript``).
    """
    rows, skipped = _read_rows(front, data, columns or {}, window_s)
    evaluation = Evaluation("faithfulness", draws=draws, seed=seed, skipped=skipped)
    if not rows:
        reasons = "; ".join(skip.reason for skip in skipped[:3])
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}.")
    method_kwargs = method_kwargs or {}
    token_rows = {}

    def score(method: str):
        attribution = front.for_method(method)
        explained = []
        for row, signal, words, transcript in rows:
            sequence = attribution.attribute(signal, transcript, words=words, window_s=window_s, show_progress=False,
                                             **method_kwargs.get(method, {})).sequence_attributions[0]  # fmt: skip
            explained.append((sequence, signal, attribution.units(signal, words, window_s, f"Row {row}")))
        token_rows[method] = speech_faithfulness(attribution, explained, DEFAULT_FRACTIONS, random_draws, seed)
        return faithfulness_result(token_rows[method]), explanations([sequence for sequence, _, _ in explained])

    score_methods(evaluation, methods, score, examples, show_progress)
    evaluation.baseline = faithfulness_baseline(token_rows[next(iter(evaluation.results))])
    return evaluation


def _read_rows(front, data, columns: dict[str, str], window_s: float) -> tuple[list, list[Skipped]]:
    """The rows whose audio, alignment and transcript the front end takes ``(row, signal, words, transcript)``, and
    the others skipped with their reason."""
    names = {"audio": "audio", "words": "words", "transcript": "transcript"}
    names.update({role: name for role, name in columns.items() if role in names and name})
    rows, skipped = [], []
    for index, raw in enumerate(read_rows(data)):
        if raw.get(names["audio"]) in (None, ""):
            if index == 0 and names["audio"] not in raw:
                raise EvaluationInputError(f"The data has no column {names['audio']!r}.")
            skipped.append(Skipped(index, "missing audio"))
            continue
        words, transcript = raw.get(names["words"]), raw.get(names["transcript"]) or None
        try:
            words = json.loads(words) if isinstance(words, str) else words
            signal = read_audio(raw[names["audio"]], front.sampling_rate, f"Row {index}")
            front.validate([signal], [transcript if front.whisper else None], [words], window_s, [f"Row {index}"])
        except (AudioError, ValueError) as error:
            skipped.append(Skipped(index, str(error)))
            continue
        rows.append((index, signal, words, transcript if front.whisper else None))
    return rows, skipped


def run_speech_faithfulness(model, methods: list[str], data, protocol: str, found, settings) -> Evaluation:
    """The faithfulness protocol on a speech model (the protocol registry's entry:
    :func:`evaluate_speech_faithfulness`)."""
    from ..frontends import as_front_end

    model = as_front_end(model, methods[0], found, processor=settings.processor)
    return evaluate_speech_faithfulness(model, methods, data, method_kwargs=settings.method_kwargs,
                                        draws=settings.draws, seed=settings.seed, examples=settings.examples,
                                        random_draws=settings.random_draws, show_progress=settings.show_progress,
                                        columns=settings.columns)  # fmt: skip


def stored_faithfulness(front, run, ids, sequences, random_draws: int, seed: int, show_progress: bool):
    """A stored speech run's faithfulness: each example's audio read again from the file its row names, cut into the
    units the run cut it into, every explained entry's AOPC with units silenced (:func:`speech_faithfulness`)."""
    explained = [(sequence, *_stored_audio(front, run, example_id, sequence)) for example_id, sequence in
                 zip(ids, sequences, strict=True)]  # fmt: skip
    return speech_faithfulness(front, explained, DEFAULT_FRACTIONS, random_draws, seed), None


def _stored_audio(front, run, example_id: str, sequence) -> tuple:
    """A speech example's signal, read again from the file its row names, and its units as the run cut them (its
    word intervals, or windows of the run's ``window_s``), checked against the stored units."""
    inputs = run.inputs(example_id)
    name = f"Example {example_id!r}"
    try:
        signal = front.check_length(read_audio(inputs["source_text"], front.sampling_rate, name), name)
        options = run.manifest["options"]
        rule = front.declaration.word_frames(options)  # the run's convention gave its words their frames
        units = front.units(signal, inputs["words"], options.get("window_s", DEFAULT_WINDOW_S), name, rule)
    except AudioError as error:
        raise EvaluationInputError(
            f"{error} The faithfulness of a speech run reads its audio files again: evaluate it where they are (the "
            "paths are the run's data's, relative ones from the folder the run was made in)."
        ) from None
    stored = [token.token for token in sequence.source]
    if [unit.label for unit in units] != stored:
        raise EvaluationInputError(
            f"{name}: its audio {inputs['source_text']!r} no longer gives the units the run stored ({stored}): the "
            "file changed since the run, or the run was stored before its word intervals were kept; run it again."
        )
    return signal, units
