"""The two kinds of result a method returns, whatever the method: maps, or scores of a logit.

- :class:`LayerMaps`: token-to-token maps, per layer ``(B, L, i, j)`` (``L`` may be (layer, head) slots) or rolled
  out ``(B, i, j)``: ``target`` (the decoder's prefix; decoder-only: the whole sequence), ``source`` (encoder–decoders:
  the source tokens) and ``encoder`` (the encoder's own map).
- :class:`LogitScores`: signed token scores ``target`` ``(B, [slots,] T, T)`` and ``source`` whose sum, plus the
  completing ``terms`` (the parts of the logit given to no token, every one named ``unattributed_*``: one vocabulary
  for all logit methods), is the model's own ``logit`` ``(B, T)`` at every explained position.

``axis`` names the entries of the extra last axis (layers, or (layer, head) slots), or is None without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # results are read without torch (the declarations listing); only total() computes
    import torch


@dataclass
class LayerMaps:
    """Token-to-token maps (see the module docstring). ``positions`` holds per-position extras ``(B, T, ...)`` over
    the decoder positions (e.g. the context-mixing ratio)."""

    target: torch.Tensor
    source: torch.Tensor | None = None
    encoder: torch.Tensor | None = None
    positions: dict[str, torch.Tensor] = field(default_factory=dict)
    axis: list[str] | None = None

    def layer_mean(self) -> LayerMaps:
        """Per-layer maps ``(B, L, ...)`` averaged over their layers (a map method's one map where its papers read
        maps per layer: value zeroing, the attention norm); ``positions`` as they are. Rows that sum to 1 in every
        layer still do."""
        mean = {name: None if value is None else value.mean(1) for name, value in
                (("target", self.target), ("source", self.source), ("encoder", self.encoder))}  # fmt: skip
        return LayerMaps(**mean, positions=self.positions)


@dataclass
class LogitScores:
    """Signed token scores of a logit and the terms that complete it (see the module docstring)."""

    def total(self) -> torch.Tensor:
        import torch

        """``(B, T)``: token scores (over every slot) plus the completing terms; the logit wherever it is explained."""

        def summed(scores: torch.Tensor | None) -> torch.Tensor:
            if scores is None:
                return torch.zeros_like(self.logit)
            return scores.sum(-1) if scores.dim() == 3 else scores.sum(-1).sum(1)

        return summed(self.target) + summed(self.source) + sum(self.terms.values(), torch.zeros_like(self.logit))

    target: torch.Tensor
    source: torch.Tensor | None
    logit: torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    logit_after_softcap: torch.Tensor | None = None
    axis: list[str] | None = None
    #: Whether the token scores and terms add up to the logit (DecompX's per-head output gives each head's direct
    #: contribution only, not a decomposition of the logit).
    complete: bool = True
