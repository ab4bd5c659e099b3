"""The speech front end: Whisper and wav2vec 2.0 / HuBERT, on audio units, with Inseq's output.

Inseq takes no audio. :func:`inseq_mixing.load_model` gives speech models a :class:`SpeechAttributionModel` whose
``.attribute(audio, targets, words=...)`` returns ``inseq.FeatureAttributionOutput``:

- ``source``: the audio units of each utterance (:mod:`inseq_mixing.frontends.audio`): the words of ``words=`` (a
  forced alignment), or fixed windows of ``window_s`` seconds, plus silences and Whisper's padding, each labelled;
- Whisper (``WhisperForConditionalGeneration``): ``target`` = the decoder's prompt and transcript tokens,
  teacher-forced (``targets=`` a text per utterance; default: the model's greedy transcript);
  ``source_attributions`` ``(units, transcript tokens[, layers])``, ``target_attributions`` over the decoder's own
  text, ``sequence_scores["encoder_self_scores"]`` ``(units, units[, layers])``;
- CTC models (``Wav2Vec2ForCTC``, ``HubertForCTC``): ``target`` = the explained frames, labelled with the character
  predicted there and the time (default: the frames where greedy CTC decoding emits a character; ``targets=`` frame
  indices); ``source_attributions`` ``(units, frames[, layers])`` and the unit-to-unit map in
  ``sequence_scores["encoder_self_scores"]``; bare encoders (``Wav2Vec2Model``, ``HubertModel``, ``WhisperEncoder``):
  map methods, ``targets=`` frames to explain (default: every frame), and the unit map.

Every method runs on frames and is pooled onto units by its declaration (:meth:`Declaration.run`: key frames summed per
unit, query frames averaged); value zeroing zeroes whole units. Decompositions start at the first block's input,
after the convolutional front end and the positions (wav2vec 2.0's positional convolution included): those mix
neighbouring frames outside attention. No math here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..declarations import DECLARATIONS, InputSize, Request
from ..methods.results import LogitScores
from ..methods.units import FrameUnits
from ..specs import get_spec
from ..trace import ModelCall, trace_call
from .audio import DEFAULT_WINDOW_S, AudioError, Unit, audio_units, item_name, read_audio
from .common import FrontEndModel, plain, saved_model
from .layout import decoder_layout, logit_step_scores, row_steps, sequence_output, token_list, tokens_first


def load_processor(name: str):
    """The processor saved with a speech model: ``AutoProcessor``, or failing that (a folder whose tokenizer is not
    the family's own class) its feature extractor and tokenizer read separately.

    Raises:
        ValueError: ``name`` holds no feature extractor (saying what the folder needs, and the alternative).
    """
    from types import SimpleNamespace

    import transformers

    try:
        processor = transformers.AutoProcessor.from_pretrained(name)
        if hasattr(processor, "feature_extractor"):
            return processor
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    try:
        extractor = transformers.AutoFeatureExtractor.from_pretrained(name)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{name} has no feature extractor (preprocessor_config.json), which a speech model needs to read audio: "
            "save the model's processor into it (processor.save_pretrained(folder)), or give the processor apart "
            "(--processor NAME_OR_FOLDER; Python: processor=...)."
        ) from error
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, TypeError):
        tokenizer = None
    return SimpleNamespace(feature_extractor=extractor, tokenizer=tokenizer)


@dataclass
class Utterance:
    """One utterance to explain: its signal, target (transcript or frames, None: the model's own) and word
    intervals (None: windows), and how errors name it."""

    signal: object
    target: object
    words: list | None
    name: str


@dataclass
class CallSettings:
    """The per-call arguments of :meth:`SpeechAttributionModel.attribute` every batch shares."""

    window_s: float
    prompt_ids: list[int] | None
    max_new_tokens: int
    word_frames: str = "centre"  # how a word gets its frames (the method's convention: audio_units' rule)


@dataclass
class _Batch:
    """One batch of utterances, prepared for the model, with the method's request."""

    call: ModelCall
    units: list[list[Unit]]
    members: torch.Tensor  # (B, U, frames)
    explained: list[list[int]]  # per utterance: explained decoder positions (Whisper) or frames (CTC)
    predicted: torch.Tensor  # (B, T)
    prompt: list[int]
    tokens: list[list[int]]  # Whisper: each utterance's decoder tokens (prompt + transcript)
    request: Request | None = None

    @property
    def size(self) -> int:
        return len(self.units)


class SpeechAttributionModel(FrontEndModel):
    """A speech model with one attribution method (see the module docstring).

    Args:
        model: ``WhisperForConditionalGeneration``, ``Wav2Vec2ForCTC``, ``HubertForCTC`` or a bare encoder.
        processor: Its processor (feature extractor and tokenizer; a bare encoder needs the feature extractor only).
        method: One of this package's methods.
    """

    item_name = "utterance"

    def __init__(self, model: nn.Module, processor, method: str):
        if method not in DECLARATIONS:
            raise ValueError(
                f"Unknown method {method!r} for speech models: use one of {list(DECLARATIONS)} (Inseq's gradient "
                "methods need token embeddings and are not offered on audio)."
            )
        self.model, self.method, self.declaration = model, method, DECLARATIONS[method]
        self.spec = get_spec(model)
        self.feature_extractor = getattr(processor, "feature_extractor", processor)
        self.tokenizer = getattr(processor, "tokenizer", None)
        self.whisper = self.spec.is_encoder_decoder
        self.mel = self.spec.family == "whisper"  # log-mel input of fixed length (the whole model or its encoder)
        self.task = "transcription" if self.whisper else (self.spec.head.task if self.spec.head else None)
        if self.declaration.explains_logit and not self.spec.explains_logits:
            raise ValueError(
                f"{method} explains a logit, and {type(model).__name__} is a bare encoder: load it with its head "
                "(WhisperForConditionalGeneration, Wav2Vec2ForCTC, HubertForCTC) or use a map method."
            )
        if self.tokenizer is None and self.task is not None:
            raise ValueError("Pass the model's processor (feature extractor and tokenizer): processor=...")
        self.sampling_rate = int(self.feature_extractor.sampling_rate)

    def for_method(self, method: str, model: nn.Module | None = None) -> SpeechAttributionModel:
        """The same processor with another method (and, given, another model of the same configuration)."""
        from types import SimpleNamespace

        processor = SimpleNamespace(feature_extractor=self.feature_extractor, tokenizer=self.tokenizer)
        return SpeechAttributionModel(self.model if model is None else model, processor, method)

    @property
    def frame_seconds(self) -> float:
        """Seconds per frame of the audio stack (20 ms for Whisper and wav2vec 2.0 at 16 kHz)."""
        if self.mel:
            encoder = self.model.get_encoder() if self.whisper else self.model
            stride = encoder.conv1.stride[0] * encoder.conv2.stride[0]
            return self.feature_extractor.hop_length * stride / self.sampling_rate
        return math.prod(self.model.config.conv_stride) / self.sampling_rate

    def attribute(
        self,
        audio,
        targets=None,
        *,
        words: list | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        prompt_ids: list[int] | None = None,
        max_new_tokens: int = 64,
        batch_size: int = 4,
        show_progress: bool = True,
        **method_options,
    ):
        """Explain one utterance or several (see the module docstring for what is explained).

        Args:
            audio: A path to a WAV/FLAC file or a 1-D array at the processor's sampling rate, or a list of them.
            targets: Whisper: the transcript to explain, per utterance (default: the greedy transcript). CTC and bare
                encoders: the frame indices to explain, per utterance.
            words: Per utterance, ``[(word, start_s, end_s), ...]`` (a forced alignment), or None for windows.
            window_s: Length of the fixed windows used without ``words``.
            prompt_ids: Whisper: the decoder's prompt tokens (default: the tokenizer's ``prefix_tokens``, else the
                decoder start token).
            max_new_tokens: Whisper: the longest greedy transcript.
            batch_size: Utterances per forward pass (wav2vec 2.0 models with a group-norm feature encoder run one at
                a time: that norm reads the whole padded signal).
            show_progress: Show a progress bar over batches.
            method_options: The method's options (``inseq-mixing methods --options``); and Inseq's names:
                ``generated_texts`` (Whisper's transcripts), ``attributed_fn="logit"`` (what is explained) and
                ``step_scores`` (``"probability"``, ``"entropy"``, ``"logit"`` of each explained entry).

        Returns:
            ``inseq.FeatureAttributionOutput``, one sequence per utterance.
        """
        single = not isinstance(audio, list | tuple)
        call = {"words": words, "window_s": window_s, "prompt_ids": prompt_ids, "max_new_tokens": max_new_tokens,
                "single": single}  # fmt: skip
        return self.attribute_inputs([audio] if single else list(audio), targets, batch_size=batch_size,
                                     show_progress=show_progress, method_options=method_options,
                                     call=call)  # fmt: skip

    NO_FOILS = (
        "speech models explain the logits of their own transcript or frames, without a foil (contrastive "
        "explanations are offered on text models)"
    )

    def items(self, inputs: list, targets, foils, *, words=None, single: bool = False, **_call) -> list[Utterance]:
        """Each utterance read and checked (too short, too long: named before any work), with its targets and
        words."""
        names = [f"Audio {index}" for index in range(len(inputs))]
        signals = [self.check_length(read_audio(item, self.sampling_rate, name), name)
                   for name, item in zip(names, inputs, strict=True)]  # fmt: skip
        targets = _per_item(plain(targets), len(inputs), "targets", single)
        words = _per_item(words, len(inputs), "words", single)
        return [Utterance(*entry) for entry in zip(signals, targets, words, names, strict=True)]

    def call_settings(self, options: dict, *, window_s: float = DEFAULT_WINDOW_S, prompt_ids=None,
                      max_new_tokens: int = 64, **_call) -> CallSettings:  # fmt: skip
        return CallSettings(window_s, prompt_ids, max_new_tokens, self.declaration.word_frames(options))

    def batch_size_for(self, batch_size: int) -> int:
        """One utterance at a time where a group-norm feature encoder reads the whole padded signal."""
        return 1 if getattr(self.model.config, "feat_extract_norm", None) == "group" else batch_size

    def info_entries(self, items: list[Utterance], settings: CallSettings | None = None) -> dict:
        window_s = settings.window_s
        return {
            "task": self.task or "encoder",
            "sampling_rate": self.sampling_rate,
            "frame_seconds": self.frame_seconds,
            "units": "words" if any(item.words is not None for item in items) else f"windows of {window_s} s",
            "attributed_fn": "logit" if self.declaration.explains_logit else f"{self.method} map",
            # each source unit's interval, per utterance (the explorer places the units on the waveform)
            "unit_seconds": [
                [
                    [unit.start_s, unit.end_s]
                    for unit in self.units(u.signal, u.words, window_s, u.name, settings.word_frames)
                ]
                for u in items
            ],  # fmt: skip
        }

    # ----- inputs -----

    @property
    def shortest_samples(self) -> int:
        """The fewest samples that make one frame: Whisper pads every utterance to its window (1), a wav2vec 2.0 /
        HuBERT feature encoder needs its convolutions' receptive field (400 samples, 25 ms at 16 kHz, in the base
        and large models)."""
        if self.mel:
            return 1
        receptive = 1
        for kernel, stride in reversed(list(zip(self.model.config.conv_kernel, self.model.config.conv_stride,
                                                 strict=True))):  # fmt: skip
            receptive = (receptive - 1) * stride + kernel
        return receptive

    def check_length(self, signal, index: int | str):
        """``signal``, or an :class:`~inseq_mixing.frontends.audio.AudioError` naming it (``index``: its position or
        label) when it is too short to make a frame, or longer than Whisper's window."""
        name = item_name(index)
        if len(signal) < self.shortest_samples:
            raise AudioError(
                f"{name} has {len(signal)} samples ({len(signal) / self.sampling_rate * 1000:.1f} ms), but "
                f"this model's convolutional front end needs at least {self.shortest_samples} "
                f"({self.shortest_samples / self.sampling_rate * 1000:.1f} ms) to make one frame: give a longer "
                "utterance."
            )
        if self.mel and len(signal) > self.feature_extractor.n_samples:
            raise AudioError(
                f"{name} lasts {len(signal) / self.sampling_rate:.2f}s; Whisper reads "
                f"{self.feature_extractor.n_samples / self.sampling_rate:.0f}s at a time: cut it into shorter "
                "utterances."
            )
        return signal

    def frames(self, signal) -> tuple[int, int]:
        """The frames of the audio stack that hold ``signal``, and the stack's frames for it (Whisper pads every
        utterance to its fixed window; a CTC encoder has as many as hold the signal)."""
        if self.mel:
            encoder = self.model.get_encoder() if self.whisper else self.model
            total = encoder.config.max_source_positions
            return min(total, math.ceil(len(signal) / self.sampling_rate / self.frame_seconds - 1e-9)), total
        real = int(self.model._get_feat_extract_output_lengths(torch.tensor(len(signal))))
        return real, real

    def units(self, signal, words, window_s: float, index: int | str, rule: str = "centre") -> list[Unit]:
        """The units of one utterance (:func:`~inseq_mixing.frontends.audio.audio_units`; ``rule``: how a word gets
        its frames)."""
        real, total = self.frames(signal)
        return audio_units(len(signal) / self.sampling_rate, self.frame_seconds, real, total, words, window_s, index,
                           rule)  # fmt: skip

    #: Arguments of :meth:`attribute` a dataset run passes on besides the method's options.
    RUN_ARGUMENTS = ("window_s", "prompt_ids")
    GENERATES = True  # Whisper's greedy transcripts

    def check_rows(self, sources: list, targets: list, words: list, own: dict, names: list[str]) -> None:
        """A dataset run's rows checked before any work (every audio file read once, its word intervals cut into
        units: :meth:`validate`), errors naming the row."""
        self.validate(sources, self.row_targets(targets, names), words, own.get("window_s", DEFAULT_WINDOW_S), names)

    def attribute_rows(self, sources: list, targets: list, words: list, own: dict, options: dict,
                       names: list[str] | None = None, progress=None) -> list:  # fmt: skip
        """One batch of utterances of a dataset run (padded, each equal to the utterance alone), with each row's
        target text: the given one, or the explained transcript (Whisper) or the explained frames' labels (CTC)."""
        sequences = self.attribute(sources, self.row_targets(targets), words=words, batch_size=len(sources),
                                   show_progress=False, **own, **options).sequence_attributions  # fmt: skip
        rows = []
        for sequence, target in zip(sequences, targets, strict=True):
            if self.whisper:
                transcript = [token.id for token in sequence.target[sequence.attr_pos_start : sequence.attr_pos_end]]
                text = target or self.tokenizer.decode(transcript)
            else:
                text = target or " ".join(token.token for token in sequence.target)
            rows.append((sequence, text))
        return rows

    def split_target(self, text: str):
        """A dataset's target text as :meth:`attribute`'s target: Whisper's transcript as it is, a CTC or bare
        encoder's frame indices from a JSON list or whitespace-separated integers."""
        if self.whisper:
            return text
        try:
            values = json.loads(text) if text.strip().startswith("[") else text.split()
            return [int(value) for value in values]
        except (TypeError, ValueError):
            raise ValueError(f"A CTC or bare speech encoder's target is frame indices, not {text!r}.") from None

    def validate(self, audio: list, targets=None, words=None, window_s: float = DEFAULT_WINDOW_S, names=None) -> None:
        """Raise the error :meth:`attribute` would raise for these utterances (an unreadable, empty, too short or too
        long audio, bad word intervals, frames outside the audio, a transcript too long for Whisper's decoder),
        without running the model; the audio is read.

        Args:
            audio, targets, words, window_s: As for :meth:`attribute`, one entry per utterance.
            names: How the errors name each utterance (default ``"Audio 0"``, ...; a dataset run names its rows).
        """
        names = names or [f"Audio {index}" for index in range(len(audio))]
        targets = _per_item(plain(targets), len(audio), "targets", False)
        words = _per_item(words, len(audio), "words", False)
        prompt = self.default_prompt() if self.whisper else []
        for name, item, target, entry in zip(names, audio, targets, words, strict=True):
            signal = self.check_length(read_audio(item, self.sampling_rate, name), name)
            self.units(signal, entry, window_s, name)
            if self.whisper and target is not None:
                transcript = self.tokenizer(target, add_special_tokens=False).input_ids
                self.check_decoder_length(len(prompt) + len(transcript), name)
            elif target is not None:
                self._chosen_frames(target, self.frames(signal)[0], name)

    def check_decoder_length(self, tokens: int, index: int | str) -> None:
        """Refuse a Whisper decoder text (prompt and transcript) longer than the decoder's position table."""
        limit = self.spec.max_positions
        if limit is not None and tokens > limit:
            raise ValueError(
                f"{item_name(index)}: the decoder text (prompt and transcript) has {tokens} tokens; this Whisper "
                f"model reads {limit} at most: give a shorter transcript."
            )

    def features(self, signals: list) -> tuple[dict, torch.Tensor, list[int]]:
        """Model inputs, the ``(B, frames)`` mask of the audio stack, and each utterance's real frames."""
        extractor = self.feature_extractor
        real = [self.frames(signal)[0] for signal in signals]
        if self.mel:
            features = extractor(signals, sampling_rate=self.sampling_rate, return_tensors="pt")
            inputs = {"input_features": features["input_features"].to(self.device, self.model.dtype)}
            total = self.frames(signals[0])[1]
            return inputs, torch.ones(len(signals), total, dtype=torch.long, device=self.device), real
        asks_mask = bool(getattr(extractor, "return_attention_mask", False))
        features = extractor(signals, sampling_rate=self.sampling_rate, padding=True, return_tensors="pt",
                             return_attention_mask=True)  # fmt: skip
        inputs = {"input_values": features["input_values"].to(self.device, self.model.dtype)}
        if asks_mask:
            inputs["attention_mask"] = features["attention_mask"].to(self.device)
        total = max(real)
        mask = (torch.arange(total)[None, :] < torch.tensor(real)[:, None]).long().to(self.device)
        return inputs, mask, real

    def prepare(self, items: list[Utterance], settings: CallSettings) -> _Batch:
        """A batch of utterances as model inputs, cut into units, traced (Whisper: teacher-forced on the given or the
        greedy transcript), with what is explained and the method's request."""
        batch, trace = self._traced(items, settings)
        positions = torch.zeros(batch.predicted.shape, dtype=torch.bool, device=self.device)
        for row, cells in enumerate(batch.explained):
            positions[row, cells] = True
        kwargs, audio_mask = batch.call.kwargs, batch.call.encoder_mask if self.whisper else batch.call.decoder_mask
        batch.request = Request(
            spec=self.spec,
            model=self.model,
            attention_mask=audio_mask,
            target_ids=kwargs.get("decoder_input_ids"),
            target_mask=kwargs.get("decoder_attention_mask"),
            predicted_ids=batch.predicted,
            foil_ids=None,
            positions=positions,
            tracer=lambda: trace,
            units=FrameUnits(batch.members, "encoder" if self.whisper else "decoder"),
        )
        return batch

    def _traced(self, items: list[Utterance], settings: CallSettings) -> tuple[_Batch, object]:
        signals, names = [item.signal for item in items], [item.name for item in items]
        inputs, frame_mask, real = self.features(signals)
        total = frame_mask.shape[1]
        units = [self.units(item.signal, item.words, settings.window_s, item.name, settings.word_frames)
                 for item in items]  # fmt: skip
        members = torch.zeros(len(signals), max(len(item) for item in units), total, device=self.device)
        for row, item in enumerate(units):
            for number, unit in enumerate(item):
                members[row, number, unit.start : unit.stop] = 1
        targets = [item.target for item in items]
        if self.whisper:
            return self._whisper_batch(inputs, frame_mask, units, members, targets, settings.prompt_ids,
                                       settings.max_new_tokens, names)  # fmt: skip
        explained = [None if targets[row] is None else self._chosen_frames(targets[row], real[row], names[row])
                     for row in range(len(signals))]  # fmt: skip
        call = ModelCall(self.model, inputs, frame_masks={"decoder": frame_mask})
        trace = trace_call(self.spec, call)
        predicted = torch.zeros_like(frame_mask) if trace.logits is None else trace.logits.argmax(-1)
        explained = [cells if cells is not None else self._default_frames(predicted[row], real[row], names[row])
                     for row, cells in enumerate(explained)]  # fmt: skip
        return _Batch(call, units, members, explained, predicted, [], []), trace

    @staticmethod
    def _chosen_frames(chosen, frames: int, name: str) -> list[int]:
        """The frame indices given by ``targets=`` (one, or a list), checked against the utterance's frames."""
        chosen = [int(frame) for frame in ([chosen] if isinstance(chosen, int) else chosen)]
        bad = [frame for frame in chosen if not 0 <= frame < frames]
        if bad:
            raise ValueError(f"{name} has {frames} frames: frames {bad} are outside it.")
        return chosen

    def _default_frames(self, predicted: torch.Tensor, frames: int, name: str) -> list[int]:
        """Every frame (a bare encoder), or the frames where greedy CTC decoding emits a character."""
        if self.task is None:
            return list(range(frames))
        ids = predicted[:frames].tolist()
        blank = self.model.config.pad_token_id
        emitted = [frame for frame, idx in enumerate(ids) if idx != blank and (frame == 0 or ids[frame - 1] != idx)]
        if not emitted:
            raise ValueError(
                f"{name}: greedy CTC decoding emits nothing (every frame is blank): pass targets= with the frame "
                "indices to explain."
            )
        return emitted

    def _whisper_batch(self, inputs, frame_mask, units, members, targets, prompt_ids, max_new_tokens, names):
        prompt = list(prompt_ids) if prompt_ids is not None else self.default_prompt()
        transcripts = []
        missing = [row for row, target in enumerate(targets) if target is None]
        greedy = self._greedy(inputs, prompt, max_new_tokens, missing) if missing else {}
        for row, target in enumerate(targets):
            ids = greedy[row] if target is None else self.tokenizer(target, add_special_tokens=False).input_ids
            if not ids:
                raise ValueError(
                    f"{names[row]}: the transcript to explain is empty (Whisper's greedy transcript ended at once): "
                    "pass targets= with the text to explain."
                )
            transcripts.append(prompt + list(ids))
        for tokens, name in zip(transcripts, names, strict=True):
            self.check_decoder_length(len(tokens), name)
        longest = max(len(tokens) for tokens in transcripts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        full = torch.full((len(transcripts), longest), pad, dtype=torch.long, device=self.device)
        for row, tokens in enumerate(transcripts):
            full[row, : len(tokens)] = torch.tensor(tokens)
        decoder_ids, predicted = full[:, :-1], full[:, 1:]
        lengths = torch.tensor([len(tokens) - 1 for tokens in transcripts], device=self.device)
        decoder_mask = (torch.arange(longest - 1, device=self.device)[None, :] < lengths[:, None]).long()
        kwargs = {**inputs, "decoder_input_ids": decoder_ids, "decoder_attention_mask": decoder_mask,
                  "use_cache": False}  # fmt: skip
        call = ModelCall(self.model, kwargs, frame_masks={"encoder": frame_mask})
        explained = [list(range(len(prompt) - 1, len(tokens) - 1)) for tokens in transcripts]
        trace = trace_call(self.spec, call, full_logits=False)  # the explained logits are gathered, not all 51,865
        return _Batch(call, units, members, explained, predicted, prompt, transcripts), trace

    def input_sizes(self, items: list[Utterance], settings: CallSettings | None = None) -> list[InputSize]:
        """Each utterance's frames (a CTC encoder's one stack; Whisper's encoder, padded to its window) and Whisper's
        decoder positions (its prompt and transcript, at most ``max_new_tokens`` where the transcript is greedy)."""
        sizes = []
        for item in items:
            real, total = self.frames(item.signal)
            if not self.whisper:
                sizes.append(InputSize(real))
                continue
            prompt = settings.prompt_ids if settings and settings.prompt_ids is not None else self.default_prompt()
            new = (settings.max_new_tokens if settings else 64) if item.target is None else \
                len(self.tokenizer(item.target, add_special_tokens=False).input_ids)  # fmt: skip
            sizes.append(InputSize(len(prompt) + new - 1, total))
        return sizes

    def default_prompt(self) -> list[int]:
        """Whisper's decoder prompt when none is given: the tokenizer's ``prefix_tokens``, else the decoder start
        token."""
        try:
            prefix = list(self.tokenizer.prefix_tokens)
        except (AttributeError, KeyError, TypeError, ValueError):
            prefix = []
        return prefix or [self.model.config.decoder_start_token_id]

    @torch.no_grad()
    def _greedy(self, inputs: dict, prompt: list[int], max_new_tokens: int, rows: list[int]) -> dict[int, list[int]]:
        """Whisper's greedy transcript of ``rows`` (until the end-of-text token), the encoder run once."""
        eos = self.tokenizer.eos_token_id
        eos = self.model.config.eos_token_id if eos is None else eos
        features = inputs["input_features"][rows]
        encoded = self.model.get_encoder()(input_features=features).last_hidden_state
        ids = torch.tensor([prompt] * len(rows), device=self.device)
        done = torch.zeros(len(rows), dtype=torch.bool, device=self.device)
        for _ in range(max_new_tokens):
            logits = self.model(encoder_outputs=(encoded,), decoder_input_ids=ids, use_cache=False).logits[:, -1]
            step = logits.argmax(-1).masked_fill(done, eos)
            ids = torch.cat([ids, step[:, None]], dim=1)
            done |= step == eos
            if bool(done.all()):
                break
        result = {}
        for position, row in enumerate(rows):
            tokens = ids[position, len(prompt) :].tolist()
            result[row] = tokens[: tokens.index(eos)] if eos in tokens else tokens
        return result

    # ----- outputs -----

    def output_logits(self, batch: _Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's logits at every decoder position (Whisper: its LM head on the final hidden states, which the
        trace does not read in full) or frame (CTC), and the explained outputs."""
        trace = batch.request.trace
        logits = trace.logits if trace.logits is not None else self.spec.lm_head(trace.final_hidden)
        return logits, batch.predicted

    def source_words(self, sequence, text: str) -> list[int]:
        """Each unit's word of ``text`` (the words of the alignment the units were cut from, in order): a word unit
        is the next word of ``text`` with its label; silences, padding and windows belong to none."""
        words, found, position = text.split(), [], 0
        for token in sequence.source:
            index = words.index(token.token, position) if token.token in words[position:] else -1
            found.append(index)
            position = index + 1 if index >= 0 else position
        return found

    def present(self, batch: _Batch, result, row: int):
        """One utterance's sequence: the explained rows over its units; Whisper's decoder map over its own text, the
        unit-to-unit map as ``encoder_self_scores``, a logit method's logit and terms as step scores."""
        units = batch.units[row]
        count = len(units)
        cells = batch.explained[row]
        source_map = result.source if self.whisper else result.target
        sequence_scores = {}
        if getattr(result, "encoder", None) is not None:
            sequence_scores["encoder_self_scores"] = tokens_first(result.encoder[row][..., :count, :count])
        signed = isinstance(result, LogitScores)
        steps = logit_step_scores(result, contrastive=False) if signed else {}
        source = token_list([unit.label for unit in units], list(range(count)))
        target_attributions = None
        if self.whisper:
            tokens = batch.tokens[row]
            target = token_list(self.tokenizer.convert_ids_to_tokens(tokens), tokens)
            target_attributions = decoder_layout(result.target[row], cells, len(tokens))
            start, stop = len(batch.prompt), len(tokens)
        else:
            ids = batch.predicted[row, cells].tolist()
            names = self.tokenizer.convert_ids_to_tokens(ids) if self.tokenizer is not None else ["frame"] * len(ids)
            seconds = self.frame_seconds
            labels = [f"{name}@{cell * seconds:.2f}s" for name, cell in zip(names, cells, strict=True)]
            target = token_list(labels, ids)
            start, stop = 0, len(cells)
        return sequence_output(
            source,
            target,
            tokens_first(source_map[row][..., cells, :count]),
            signed=signed,
            target_attributions=target_attributions,
            step_scores=row_steps(steps, row, cells),
            sequence_scores=sequence_scores,
            start=start,
            stop=stop,
        )


def load_saved(name: str, config, tokenizer, processor):
    """A speech model saved under ``name``, as the class it was saved as, with its processor when not given (the
    speech kind's loader)."""
    processor = processor or load_processor(name)  # a missing processor said before the weights are read
    return saved_model(name, config), tokenizer, processor


def explorer_media(front: SpeechAttributionModel, inputs) -> dict:
    """What the explorer draws beside a speech model's scores: each input's waveform, read at the model's rate."""
    listed = inputs if isinstance(inputs, list | tuple) else [inputs]
    rate = front.sampling_rate
    return {"audio": [read_audio(item, rate, f"Audio {i}") for i, item in enumerate(listed)], "sampling_rate": rate}


def _per_item(values, count: int, what: str, single: bool) -> list:
    """``targets`` / ``words`` as one entry per utterance (unwrapped when one utterance was given alone)."""
    if values is None:
        return [None] * count
    if single:
        return [values]
    if isinstance(values, str) or len(values) != count:
        raise ValueError(f"{what} must have one entry per utterance ({count}), not {values!r}.")
    return list(values)
