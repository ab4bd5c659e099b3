"""Audio for the speech front end: reading signals, and cutting an utterance's frames into labelled units.

Reading uses ``soundfile`` (libsndfile: WAV, FLAC, OGG) and resamples with ``soxr``; arrays are taken as they are, at
the processor's sampling rate. Units (:func:`audio_units`) partition the frames of an utterance: the words of a forced
alignment ``(word, start_s, end_s)``, or fixed windows, plus the frames outside every word (silences) and Whisper's
padding to its fixed input length, each its own labelled unit, so no frame is dropped.

A frame belongs to the word whose interval holds the frame's centre; a word shorter than a frame gets the frame that
holds its midpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class AudioError(ValueError):
    """An audio input that cannot be read or cut as asked; the message names the item and what to do."""


def item_name(index: int | str) -> str:
    """How a message names an utterance: ``"Audio 3"`` for its position in a call, or a label as given (a dataset
    run's ``"Row 3 (id 'x')"``)."""
    return index if isinstance(index, str) else f"Audio {index}"


def read_audio(item, sampling_rate: int, index: int | str = 0) -> np.ndarray:
    """One utterance as a 1-D float32 array at ``sampling_rate``.

    Args:
        item: A path to an audio file (resampled when its rate differs; several channels averaged), or a 1-D array of
            samples already at ``sampling_rate``.
        sampling_rate: The processor's sampling rate.
        index: The item's position in the call, or its label, for error messages.

    Raises:
        AudioError: An unreadable file, an empty signal, a non-1-D array, or non-finite samples.
    """
    if isinstance(item, str | Path):
        import soundfile

        try:
            signal, rate = soundfile.read(str(item), dtype="float32", always_2d=True)
        except (RuntimeError, OSError, soundfile.LibsndfileError) as error:
            name = item_name(index)
            raise AudioError(f"{name}: cannot read {str(item)!r} ({error}). Give a WAV or FLAC file.") from None
        signal = signal.mean(axis=1)
        if rate != sampling_rate and len(signal):
            import soxr

            signal = soxr.resample(signal, rate, sampling_rate).astype(np.float32)
    else:
        if hasattr(item, "detach"):  # a torch tensor
            item = item.detach().cpu().numpy()
        signal = np.asarray(item, dtype=np.float32)
        if signal.ndim != 1:
            raise AudioError(
                f"{item_name(index)} has shape {signal.shape}: give a 1-D (mono) signal at {sampling_rate} Hz, or a "
                "file path (files are resampled and mixed down for you)."
            )
    if not len(signal):
        raise AudioError(f"{item_name(index)} is empty.")
    if not np.isfinite(signal).all():
        raise AudioError(f"{item_name(index)} contains NaN or infinite samples.")
    return signal


#: Length in seconds of the fixed windows an utterance without word intervals is cut into.
DEFAULT_WINDOW_S = 0.5


@dataclass(frozen=True)
class Unit:
    """A labelled span of frames ``[start, stop)`` of one utterance.

    Attributes:
        label: The word, ``"0.50-1.00s"`` for a window, ``"[sil 1.20-1.45s]"`` or ``"[pad 3.00-30.00s]"``.
        kind: ``"word"``, ``"window"``, ``"silence"`` or ``"padding"``.
        start: First frame.
        stop: One past the last frame.
        start_s: Start time in seconds.
        end_s: End time in seconds.
    """

    label: str
    kind: str
    start: int
    stop: int
    start_s: float
    end_s: float


def audio_units(
    duration_s: float,
    frame_s: float,
    real_frames: int,
    total_frames: int,
    words: list | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    index: int | str = 0,
    rule: str = "centre",
) -> list[Unit]:
    """The units of one utterance, in time order, covering frames ``[0, total_frames)``.

    Args:
        duration_s: The signal's duration.
        frame_s: Seconds per frame (the stride of the model's front end).
        real_frames: Frames that hold the signal; frames from there to ``total_frames`` are padding (Whisper pads
            every input to its fixed length; CTC encoders have ``real_frames == total_frames``).
        total_frames: Frames the model's stack has for this utterance.
        words: ``[(word, start_s, end_s), ...]`` from a forced aligner, or None for fixed windows.
        window_s: Window length without ``words``.
        index: The utterance's position in the call, or its label, for error messages.
        rule: How a word gets its frames: ``"centre"``, the frames whose centre lies in its interval (units partition
            the frames), or ``"reference"``, the speech study's code's ``ceil(r · start)`` to ``ceil(r · end)``
            inclusive, ``r`` the frames per second (neighbouring words may then share a frame; the frames of no
            word are silences).

    Raises:
        AudioError: A malformed interval, one outside the audio, overlapping intervals, or two words in one frame
            (``"centre"``).
    """
    owner = np.full(real_frames, -1)
    units: list[tuple[str, str, float, float]] = []
    if words is None:
        if not window_s > 0:
            raise AudioError(f"window_s must be positive, not {window_s!r}.")
        size = max(1, round(window_s / frame_s))
        for number, start in enumerate(range(0, real_frames, size)):
            stop = min(start + size, real_frames)
            owner[start:stop] = number
            units.append((f"{start * frame_s:.2f}-{min(stop * frame_s, duration_s):.2f}s", "window", 0.0, 0.0))
    elif rule == "reference":
        return _reference_units(_checked_words(words, duration_s, frame_s, index), frame_s, duration_s, real_frames,
                                total_frames)  # fmt: skip
    else:
        checked = _checked_words(words, duration_s, frame_s, index)
        centres = (np.arange(real_frames) + 0.5) * frame_s
        for number, (word, start_s, end_s) in enumerate(checked):
            owner[(centres >= start_s) & (centres < end_s)] = number
            units.append((str(word), "word", start_s, end_s))
        for number, (word, start_s, end_s) in enumerate(checked):
            if (owner == number).any():
                continue
            frame = min(int((start_s + end_s) / 2 / frame_s), real_frames - 1)  # shorter than a frame: its midpoint's
            if owner[frame] >= 0:
                raise AudioError(
                    f"{item_name(index)}: the word {word!r} is shorter than a frame ({frame_s * 1000:.0f} ms) and "
                    f"falls within a frame of {checked[owner[frame]][0]!r}: merge the two intervals."
                )
            owner[frame] = number
    return _spans(owner, units, frame_s, duration_s, real_frames, total_frames)


def _checked_words(words, duration_s: float, frame_s: float, index: int | str) -> list[tuple[str, float, float]]:
    checked = []
    for entry in words:
        try:
            word, start_s, end_s = entry
            start_s, end_s = float(start_s), float(end_s)
        except (TypeError, ValueError):
            raise AudioError(
                f"{item_name(index)}: word interval {entry!r} is not (word, start_s, end_s) with times in seconds."
            ) from None
        if not 0 <= start_s < end_s:
            raise AudioError(
                f"{item_name(index)}: word {word!r} has the interval {start_s}-{end_s}s: need 0 <= start < end."
            )
        if end_s > duration_s + frame_s:
            raise AudioError(
                f"{item_name(index)}: word {word!r} ends at {end_s}s, after the audio's end ({duration_s:.3f}s): the "
                "intervals belong to another file, or to a different sampling rate."
            )
        checked.append((word, start_s, end_s))
    checked.sort(key=lambda entry: entry[1])
    for (first, _, first_end), (second, second_start, _) in zip(checked, checked[1:], strict=False):
        if second_start < first_end - 1e-9:
            raise AudioError(
                f"{item_name(index)}: the intervals of {first!r} (ends {first_end}s) and {second!r} (starts "
                f"{second_start}s) overlap: give non-overlapping word intervals."
            )
    if not checked:
        raise AudioError(f"{item_name(index)}: words is empty: give at least one word, or words=None for windows.")
    return checked


def _reference_units(words: list, frame_s: float, duration_s: float, real_frames: int, total_frames: int):
    """Units by the speech study's rule (:func:`audio_units`, ``rule="reference"``): each word its frames
    ``ceil(r · start) … ceil(r · end)`` inclusive (within the real frames), the frames between words silences."""
    rate = 1.0 / frame_s
    covered = np.zeros(real_frames, dtype=bool)
    spans = []
    for word, start_s, end_s in words:
        start, stop = min(math.ceil(rate * start_s), real_frames - 1), min(math.ceil(rate * end_s) + 1, real_frames)
        covered[start:stop] = True
        spans.append(Unit(str(word), "word", start, stop, start_s, end_s))
    owner = np.where(covered, 0, -1)  # the silences: runs of frames of no word
    silences = [unit for unit in _spans(owner, [("", "word", 0.0, 0.0)], frame_s, duration_s, real_frames, real_frames)
                if unit.kind == "silence"]  # fmt: skip
    units = sorted([*spans, *silences], key=lambda unit: (unit.start, unit.stop))
    if total_frames > real_frames:
        begin, end = real_frames * frame_s, total_frames * frame_s
        units.append(Unit(f"[pad {begin:.2f}-{end:.2f}s]", "padding", real_frames, total_frames, begin, end))
    return units


def _spans(owner, named, frame_s, duration_s, real_frames, total_frames) -> list[Unit]:
    """Contiguous runs of frames with the same owner as units; frames of no word are silences; the padding last."""
    result = []
    start = 0
    while start < real_frames:
        stop = start + 1
        while stop < real_frames and owner[stop] == owner[start]:
            stop += 1
        begin, end = start * frame_s, min(stop * frame_s, duration_s)
        if owner[start] < 0:
            result.append(Unit(f"[sil {begin:.2f}-{end:.2f}s]", "silence", start, stop, begin, end))
        else:
            label, kind, start_s, end_s = named[owner[start]]  # a word's frames are contiguous: one run each
            if kind == "window":
                start_s, end_s = begin, end
            result.append(Unit(label, kind, start, stop, start_s, end_s))
        start = stop
    if total_frames > real_frames:
        begin, end = real_frames * frame_s, total_frames * frame_s
        result.append(Unit(f"[pad {begin:.2f}-{end:.2f}s]", "padding", real_frames, total_frames, begin, end))
    return result
