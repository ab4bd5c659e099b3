"""The Inseq output classes of this package's sequences and steps (every front end's: :mod:`.layout` builds them).

Importing this module imports Inseq; :mod:`.layout` imports it only when it builds an output.
"""

from dataclasses import dataclass

import torch
from inseq.data import MultiDimensionalFeatureAttributionStepOutput
from inseq.data.attribution import MultiDimensionalFeatureAttributionSequenceOutput


@dataclass(eq=False, repr=False)
class MixingSequenceOutput(MultiDimensionalFeatureAttributionSequenceOutput):
    """Sequence output that recovers its number of extra dimensions after ``FeatureAttributionOutput.load``.

    Inseq does not save private fields, so a loaded multi-dimensional output would lose its aggregator and render as
    a tree instead of a heatmap. The count is the number of axes beyond (attributed tokens, generated tokens).
    """

    def _recover_from_safetensors(self):
        super()._recover_from_safetensors()
        scores = self.source_attributions if self.source_attributions is not None else self.target_attributions
        if not self._num_dimensions and scores is not None:
            self._num_dimensions = scores.ndim - 2
            self._aggregator = ["mean"] * self._num_dimensions
        return self


@dataclass(eq=False, repr=False)
class SignedMixingSequenceOutput(MixingSequenceOutput):
    """Sequence output of signed scores (logit contributions): heatmap colours are symmetric around 0.

    Inseq colours cells from ``-maximum`` to ``maximum``; here ``maximum`` is the largest absolute score, so negative
    scores get the full blue half of the diverging scale.
    """

    @property
    def maximum(self) -> float:
        largest = 0.0
        for scores in (self.source_attributions, self.target_attributions):
            if scores is not None:
                largest = max(largest, float(torch.nan_to_num(scores).abs().max()))
        return largest

    @property
    def minimum(self) -> float:
        return -self.maximum


@dataclass(eq=False, repr=False)
class MixingStepOutput(MultiDimensionalFeatureAttributionStepOutput):
    """Step output producing :class:`MixingSequenceOutput` (or, for signed scores, the signed variant) sequences."""

    _sequence_cls: type = MixingSequenceOutput

    def __post_init__(self):
        """Inseq 0.7's, without its cast of every score to float32 when the scores are float64 (a float64 model's:
        the precision its user asked for); other scores are cast as Inseq casts them."""
        tensors = [self.source_attributions, self.target_attributions, *(self.step_scores or {}).values(),
                   *(self.sequence_scores or {}).values()]  # fmt: skip
        if not any(isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float64 for tensor in tensors):
            super().__post_init__()
            return
        self._num_dimensions = self._num_dimensions or 0
        self.step_scores = self.step_scores or {}
        self.sequence_scores = self.sequence_scores or {}

    def get_sequence_cls(self, **kwargs):
        return self._sequence_cls(_num_dimensions=self._num_dimensions, **kwargs)
