r"""Audio units: the frames of a speech model's audio stack grouped into words (or fixed windows, or silence), and the
pooling of frame-level scores onto them.

Speech Transformers mix *frames* (20 ms each in Whisper and wav2vec 2.0); people reason about *words*. A unit is a
set of frames (in practice a contiguous span: a word's interval from a forced aligner, a window, a silence), and
units partition the frames of each utterance (padding frames of a batch belong to none).

- Key side (what a score is *about*): a unit's score is the **sum** over its frames,
  :math:`s_{i,u} = \sum_{j \in u} s_{ij}`. Sums keep completeness (ALTI-logit, DecompX, AttnLRP: unit scores plus
  the unattributed terms still equal the logit) and keep rows summing to 1 (ALTI, attention norm, GlobEnc, rollout).
- Query side (whose mixing it is): a unit's row is the **mean** of its frames' rows,
  :math:`s_{u,v} = \frac{1}{|u|} \sum_{i \in u} s_{i,v}`, so unit rows still sum to 1.
- Value zeroing is not pooled: it zeroes all frames of a unit at once (see :mod:`.value_zeroing`), whose distance is
  not the sum of single-frame ones; its query side is the mean (or max) over the unit's frames, as the speech study
  of Mohebbi et al. (EMNLP 2023) averages over a word's frames.

Maps over frames are computed first (rollouts included: rolling out frame maps then pooling is exact, pooling each
layer first is not), then pooled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .options import UNIT_ROWS
from .results import LayerMaps, LogitScores


@dataclass
class FrameUnits:
    """Which frames make each unit, for one stack of the model.

    Attributes:
        members: ``(batch, units, frames)`` 0/1 membership (float); each real frame is in exactly one unit of its
            utterance, padding frames in none; utterances with fewer units than the batch's most are padded with
            empty units.
        stack: The stack whose positions are frames: ``"encoder"`` (Whisper) or ``"decoder"`` (a CTC encoder's one
            stack, which is explained).
    """

    members: torch.Tensor
    stack: str

    @property
    def present(self) -> torch.Tensor:
        """``(batch, units)``: whether each unit has a frame (empty units are a batch's padding)."""
        return self.members.sum(-1) > 0

    def owner(self) -> torch.Tensor:
        """``(batch, frames)``: the unit of each frame (padding frames: 0; they carry nothing)."""
        return self.members.argmax(1)

    def keys(self, scores: torch.Tensor) -> torch.Tensor:
        """Sum the last axis (frames) over each unit: ``(B, ..., frames)`` → ``(B, ..., units)``."""
        members = self.members.to(scores.dtype)
        return torch.einsum("b...s,bus->b...u", scores, members)

    def queries(self, scores: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
        """Reduce the second-to-last axis (query frames) over each unit: ``(B, ..., frames, X)`` →
        ``(B, ..., units, X)`` by the mean (or max) of the unit's frames' rows; empty units get 0."""
        members = self.members.to(scores.dtype)
        if reduce == "mean":
            weights = members / members.sum(-1, keepdim=True).clamp(min=1)
            return torch.einsum("bus,b...sx->b...ux", weights, scores)
        if reduce not in UNIT_ROWS:
            raise ValueError(f"A unit's row is one of {UNIT_ROWS} of its frames' rows, not {reduce!r}.")
        shape = (scores.shape[0],) + (1,) * (scores.dim() - 3) + (members.shape[1], members.shape[2], 1)
        inside = members.bool().view(shape)
        rows = scores.unsqueeze(-3).masked_fill(~inside, float("-inf")).amax(-2)
        return torch.where(torch.isfinite(rows), rows, torch.zeros_like(rows))

    def pool(self, result: LayerMaps | LogitScores) -> LayerMaps | LogitScores:
        """A method's frame-level result on units (see the module docstring).

        Whisper (``stack="encoder"``): ``source`` ``(B, ..., T, frames)`` → ``(B, ..., T, units)``; the encoder map
        ``(B, ..., frames, frames)`` → ``(B, ..., units, units)``; the decoder's own text untouched. CTC encoders
        (``stack="decoder"``): ``target`` keeps its frame rows (the explained frames are rows) with unit columns, and
        a map method's ``encoder`` field gets the unit-to-unit map.
        """
        if self.stack == "encoder":
            changes = {"source": self.keys(result.source)}
            if isinstance(result, LayerMaps) and result.encoder is not None:
                changes["encoder"] = self.queries(self.keys(result.encoder))
            return replace(result, **changes)
        target = self.keys(result.target)
        if isinstance(result, LogitScores):
            return replace(result, target=target)
        return replace(result, target=target, encoder=self.queries(target))
