"""The speech study's protocols (Mohebbi et al., "Homophone disambiguation reveals patterns of context mixing in
speech Transformers", EMNLP 2023) on speech models: ``cue`` and ``blankout``.

Rows (JSONL, CSV, Parquet, a DataFrame or dicts): ``audio`` (a WAV/FLAC path), ``words`` (its forced alignment: a
JSON list of ``[word, start_s, end_s]``), ``target`` (the word to explain, a homophone: a word of the alignment),
``cues`` (its cue words: words of the alignment, JSON list or space-separated) and, for Whisper, ``transcript`` (the
text the decoder is teacher-forced on; default: the aligned words joined by spaces).

- ``cue``: per method and layer, the share of the target's context mixing on its cues (absolute scores; a word's
  score is its unit's, or the sum of its tokens'): ``cue_contribution`` from the audio (Whisper: the cross-attention
  side, the target's first transcript token explained over the audio's word units; CTC encoders: the target word's
  row of the unit-to-unit map), and for Whisper ``text_cue_contribution`` from the decoder's own text (the cue words
  written before the target; rows with none are left out of that metric). Silences and padding are not context
  words. With ``random_baseline``, every method also runs on a randomly initialised copy of the model
  (``"METHOD (random init)"``), the baseline of the study; the uniform baseline is the share of cue words.
- ``blankout`` (Whisper): the drop of the probability of the target's first token when the cue words' audio samples
  are replaced by silence (``audio_cue_drop``), when a random other word's are (``audio_random_drop``: the control),
  and when the cue words' tokens in the decoder's text are replaced by the unknown token (``text_cue_drop``).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass

import numpy as np
import torch

from ..frontends.audio import AudioError, read_audio
from ..runs.data import read_rows
from .items import EvaluationInputError, Skipped
from .metrics import Statistic, cue_share, mean_statistic
from .protocols import paper_options
from .scores import RANDOM_SUFFIX, Evaluation, MethodResult, random_copy, score_methods

SPEECH_PROTOCOLS = ("cue", "blankout")
CUE_METRICS = ("cue_contribution", "text_cue_contribution")
BLANKOUT_METRICS = ("audio_cue_drop", "audio_random_drop", "text_cue_drop")
#: The name suffix of a method run on the randomly initialised copy.


@dataclass
class _Row:
    """One usable row: its index, audio (path or array), alignment, target, cues, transcript, and the signal once
    read."""

    row: int
    audio: object
    words: list[tuple[str, float, float]]
    target: str
    cues: list[str]
    transcript: str
    signal: np.ndarray | None = None

    @property
    def word_names(self) -> list[str]:
        return [str(word) for word, _, _ in self.words]


def read_speech_rows(data, columns: dict[str, str] | None = None) -> tuple[list[_Row], list[Skipped]]:
    """The usable rows and the skipped ones (with their reason)."""
    names = {"audio": "audio", "words": "words", "target": "target", "cues": "cues", "transcript": "transcript"}
    names.update({role: name for role, name in (columns or {}).items() if role in names and name})
    rows, skipped = [], []
    for index, raw in enumerate(read_rows(data)):
        missing = [role for role in ("audio", "words", "target", "cues") if raw.get(names[role]) in (None, "")]
        if missing:
            if index == 0 and any(names[role] not in raw for role in missing):
                raise EvaluationInputError(f"The data has no column {[names[role] for role in missing]}.")
            skipped.append(Skipped(index, f"missing {', '.join(missing)}"))
            continue
        words = raw[names["words"]]
        cues = raw[names["cues"]]
        try:
            words = json.loads(words) if isinstance(words, str) else words
            words = [(str(word), float(start), float(end)) for word, start, end in words]
            cues = json.loads(cues) if isinstance(cues, str) and cues.strip().startswith("[") else cues
            cues = cues.split() if isinstance(cues, str) else [str(cue) for cue in cues]
        except (TypeError, ValueError):
            skipped.append(Skipped(index, "words must be a list of [word, start_s, end_s]; cues a list of words"))
            continue
        spoken = [word for word, _, _ in words]
        target = str(raw[names["target"]])
        absent = [word for word in [target, *cues] if word not in spoken]
        if absent:
            skipped.append(Skipped(index, f"{absent} not among the aligned words {spoken}"))
            continue
        transcript = raw.get(names["transcript"]) or " ".join(spoken)
        rows.append(_Row(index, raw[names["audio"]], words, target, cues, str(transcript)))
    return rows, skipped


def evaluate_speech(
    model,
    methods: list[str],
    data,
    protocol: str,
    *,
    processor=None,
    method_kwargs: dict | None = None,
    random_baseline: bool = False,
    draws: int = 1000,
    seed: int = 0,
    show_progress: bool = False,
    **columns: str,
) -> Evaluation:
    """Evaluate ``methods`` on a speech model (see the module docstring).

    Args:
        model: A :class:`~inseq_mixing.frontends.speech.SpeechAttributionModel`, a speech HF model (with
            ``processor``), or a name or folder.
        methods: This package's method names (``blankout`` ignores them: it measures the model).
        data: The rows.
        protocol: ``"cue"`` or ``"blankout"``.
        processor: The processor of a model object.
        method_kwargs: Per method, its options.
        random_baseline: ``cue``: also run every method on a randomly initialised copy of the model.
        draws: Bootstrap resamples and permutations.
        seed: Seed of the resampling, the random copy and the random words of ``blankout``.
        show_progress: Show a progress bar over the methods.
        columns: Column names by role (``audio``, ``words``, ``target``, ``cues``, ``transcript``).
    """
    from ..frontends import as_front_end

    if protocol not in SPEECH_PROTOCOLS:
        raise EvaluationInputError(
            f"Speech models are evaluated with {SPEECH_PROTOCOLS} or 'faithfulness', not {protocol!r}."
        )
    model = as_front_end(model, methods[0], processor=processor)
    rows, skipped = read_speech_rows(data, {role.removesuffix("_column"): name for role, name in columns.items()})
    kept = []
    for row in rows:  # every row checked before any method runs: a bad one is skipped with its reason
        try:
            row.signal = model.check_length(read_audio(row.audio, model.sampling_rate, row.row), row.row)
            if model.whisper:
                _transcript_words(model.tokenizer, row)
                transcript = model.tokenizer(row.transcript, add_special_tokens=False).input_ids
                model.check_decoder_length(len(model.default_prompt()) + len(transcript), row.row)
        except (AudioError, ValueError) as error:  # EvaluationInputError is a ValueError
            skipped.append(Skipped(row.row, str(error)))
            continue
        kept.append(row)
    evaluation = Evaluation(protocol, draws=draws, seed=seed, skipped=sorted(skipped, key=lambda skip: skip.row))
    if not kept:
        reasons = "; ".join(skip.reason for skip in evaluation.skipped[:3])
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}.")
    if protocol == "blankout":
        if not model.whisper:
            raise EvaluationInputError("blankout measures a decoder's next-token probability: it needs Whisper.")
        evaluation.metric_names = BLANKOUT_METRICS
        evaluation.results["model"] = _blankout(model, kept, seed)
        return evaluation
    evaluation.metric_names = CUE_METRICS if model.whisper else CUE_METRICS[:1]
    method_kwargs = method_kwargs or {}
    copies = {"": model.model}
    if random_baseline:
        copies[RANDOM_SUFFIX] = random_copy(model.model, seed)

    def score(name: str):
        suffix = RANDOM_SUFFIX if name.endswith(RANDOM_SUFFIX) else ""
        method = name.removesuffix(suffix)
        attribution = model.for_method(method, copies[suffix])
        return _score_cue(attribution, kept, paper_options(method, method_kwargs.get(method, {}), protocol)), []

    names = [f"{method}{suffix}" for suffix in copies for method in methods]
    score_methods(evaluation, names, score, 0, show_progress)
    shares = [len(row.cues) / len(row.words) for row in kept]
    evaluation.baseline = {"cue_contribution": sum(shares) / len(shares)}
    return evaluation


def _score_cue(attribution, rows, options: dict) -> MethodResult:
    audio, text = [], []
    for row in rows:
        seq = attribution.attribute(row.signal, row.transcript if attribution.whisper else None, words=row.words,
                                    show_progress=False, **options).sequence_attributions[0]  # fmt: skip
        units = [token.token for token in seq.source]
        words = [index for index, word in enumerate(attribution.source_words(seq, " ".join(row.word_names)))
                 if word >= 0]  # fmt: skip
        cues = [words.index(index) for index in words if units[index] in row.cues]
        if attribution.whisper:
            transcript = _transcript_words(attribution.tokenizer, row)
            column = transcript.first_token
            scores = seq.source_attributions[:, column]
            audio.append(cue_share(scores[words], cues).nan_to_num(0.0))
            text.append(_text_share(transcript, row, seq, column))
        else:
            target_unit = units.index(row.target)
            scores = seq.sequence_scores["encoder_self_scores"][:, target_unit]
            audio.append(cue_share(scores[words], cues).nan_to_num(0.0))
    statistics = {}
    layers = torch.stack(audio)
    if layers.dim() == 1:
        statistics["cue_contribution"] = mean_statistic(layers)
        result = MethodResult(statistics)
    else:
        statistics["cue_contribution"] = mean_statistic(layers.mean(1))
        result = MethodResult(statistics)
        result.layer_statistics = [mean_statistic(layers[:, layer]) for layer in range(layers.shape[1])]
        result.per_layer = Statistic(layers.T, torch.ones_like(layers.T))
    if text:
        values = torch.stack([share if share.dim() == 0 else share.mean() for share in text])
        present = torch.isfinite(values)
        statistics["text_cue_contribution"] = Statistic(values.nan_to_num(0.0), present.double())
    return result


def _word_tokens(tokenizer, transcript: str) -> list[list[int]]:
    """Per whitespace word of ``transcript``, the indices of its tokens (from the fast tokenizer's offsets)."""
    encoded = tokenizer(transcript, add_special_tokens=False, return_offsets_mapping=True)
    spans, position = [], 0
    for word in transcript.split():
        start = transcript.index(word, position)
        spans.append((start, start + len(word)))
        position = start + len(word)
    tokens = [[] for _ in spans]
    for index, (start, end) in enumerate(encoded["offset_mapping"]):
        for number, (word_start, word_end) in enumerate(spans):
            if start < word_end and end > word_start:
                tokens[number].append(index)
                break
    return tokens


@dataclass
class _Transcript:
    """A row's transcript as words (stripped of surrounding punctuation, as the text protocols match words: ``weight.``
    is ``weight``), the indices of each word's tokens, and the target's word index."""

    words: list[str]
    tokens: list[list[int]]
    target: int

    @property
    def first_token(self) -> int:
        """The transcript token (the generated-token column) of the target word's first token."""
        return self.tokens[self.target][0]

    def cue_words_before_target(self, cues: list[str]) -> list[int]:
        bare = {cue.strip(string.punctuation) for cue in cues}
        return [number for number in range(self.target) if self.words[number] in bare]


def _transcript_words(tokenizer, row) -> _Transcript:
    """The row's transcript words; the target is its first word equal to the target, punctuation around either
    stripped.

    Raises:
        EvaluationInputError: The target is not a word of the transcript, or the tokenizer gives it no token.
    """
    words = [word.strip(string.punctuation) or word for word in row.transcript.split()]
    target = row.target.strip(string.punctuation) or row.target
    if target not in words:
        raise EvaluationInputError(
            f"Row {row.row}: the target {row.target!r} is not a word of the transcript {row.transcript!r}."
        )
    transcript = _Transcript(words, _word_tokens(tokenizer, row.transcript), words.index(target))
    if not transcript.tokens[transcript.target]:
        raise EvaluationInputError(f"Row {row.row}: the tokenizer gives the target {row.target!r} no token.")
    return transcript


def _text_share(transcript: _Transcript, row, seq, column: int) -> torch.Tensor:
    """Share of the target's decoder-side scores on the cue words written before it (NaN when none is)."""
    cues = transcript.cue_words_before_target(row.cues)
    if not cues:
        return torch.tensor(float("nan"), dtype=torch.float64)
    offset = seq.attr_pos_start  # transcript token k is decoder token offset + k
    scores = seq.target_attributions[:, column].nan_to_num(0.0)
    per_word = torch.stack(
        [scores[[offset + k for k in transcript.tokens[number]]].sum(0) for number in range(transcript.target)]
    )
    return cue_share(per_word, cues)


@torch.no_grad()
def _blankout(attribution, rows, seed: int) -> MethodResult:
    rng = random.Random(seed)
    drops = {name: [] for name in BLANKOUT_METRICS}
    for row in rows:
        tokenizer = attribution.tokenizer
        prompt = attribution.default_prompt()
        ids = prompt + tokenizer(row.transcript, add_special_tokens=False).input_ids
        transcript = _transcript_words(tokenizer, row)
        position = len(prompt) + transcript.first_token  # the target's first token, predicted at position - 1
        original = _probability(attribution, row.signal, ids, position)
        cue_spans = [(start, end) for word, start, end in row.words if word in row.cues]
        others = [(start, end) for word, start, end in row.words if word not in row.cues and word != row.target]
        drops["audio_cue_drop"].append(
            original - _probability(attribution, _silenced(row, cue_spans, attribution.sampling_rate), ids, position)
        )
        if others:
            control = _silenced(row, [rng.choice(others)], attribution.sampling_rate)
            drops["audio_random_drop"].append(original - _probability(attribution, control, ids, position))
        else:
            drops["audio_random_drop"].append(float("nan"))
        cue_tokens = [len(prompt) + k for number in transcript.cue_words_before_target(row.cues)
                      for k in transcript.tokens[number]]  # fmt: skip
        if cue_tokens:
            unk = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else 0
            masked = [unk if index in cue_tokens else idx for index, idx in enumerate(ids)]
            drops["text_cue_drop"].append(original - _probability(attribution, row.signal, masked, position))
        else:
            drops["text_cue_drop"].append(float("nan"))
    statistics = {}
    for name, values in drops.items():
        values = torch.tensor(values, dtype=torch.float64)
        statistics[name] = Statistic(values.nan_to_num(0.0), torch.isfinite(values).double())
    return MethodResult(statistics)


def _silenced(row, spans, sampling_rate: int) -> np.ndarray:
    """The row's signal with the samples of ``spans`` (seconds) replaced by silence."""
    signal = row.signal.copy()
    for start, end in spans:
        signal[int(start * sampling_rate) : int(end * sampling_rate)] = 0.0
    return signal


def _probability(attribution, signal, ids: list[int], position: int) -> float:
    """Whisper's probability of ``ids[position]`` given the audio and ``ids[:position]`` (teacher-forced)."""
    inputs, _, _ = attribution.features([signal])
    model = attribution.model
    decoder = torch.tensor([ids[:position]], device=attribution.device)
    logits = model(**inputs, decoder_input_ids=decoder, use_cache=False).logits[0, -1]
    return float(logits.float().softmax(-1)[ids[position]])


def run_speech(model, methods: list[str], data, protocol: str, found, settings) -> Evaluation:
    """The speech study's ``cue`` or ``blankout`` protocol (the protocol registry's entry: :func:`evaluate_speech`)."""
    from ..frontends import as_front_end

    model = as_front_end(model, methods[0], found, processor=settings.processor)
    return evaluate_speech(model, methods, data, protocol, processor=settings.processor,
                           method_kwargs=settings.method_kwargs, random_baseline=settings.random_baseline,
                           draws=settings.draws, seed=settings.seed, show_progress=settings.show_progress,
                           **settings.columns)  # fmt: skip
