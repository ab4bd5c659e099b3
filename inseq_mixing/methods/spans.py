r"""Spans of a generation explained as one quantity, scores over context units, and hops through the generated text.

**Spans** (our extension, after FlashTrace's one pass per target span). A span is a set of decoder positions, those
that predict its tokens. A logit method explains the span's summed logit :math:`\sum_{t \in \text{span}} z_t` (with
foils, the summed differences): ALTI-logit, DecompX and AttnLRP are linear in the logit they start from, so a
token's score for the span is the **sum** of its scores over the span's positions, and the span's scores plus its
summed unattributed terms equal the sum of the model's own logits (completeness holds span by span). ALTI-logit and
DecompX read every explained row from one forward pass and sum them; AttnLRP starts one backward pass from the summed
logit (:func:`~.attn_lrp.span_lrp_of_call`). A map method (value zeroing, ALTI, the norms, the rollouts) gives a span
the **mean** of its rows (each row already normalised as the method normalises it), so a span's row still sums to
what one row sums to; value zeroing's distances are normalised per row first, then averaged.

**Context units** are key-side groups of tokens (sentences, passages, any character spans, each generated token or
sentence): a unit's score is the **sum** over its tokens, as for audio units (:mod:`.units`), which keeps
completeness and rows that sum to 1. Units partition the keys: nothing is dropped.

**Hops** (our extension, after FlashTrace's recursion through reasoning tokens). A span's score on a generated token
:math:`g` that precedes it is passed back through :math:`g`'s own explanation: the row :math:`r_g` of the position
that predicts :math:`g` (over every key before :math:`g`), normalised by its L1 norm,
:math:`w_{gk} = r_{gk} / \sum_{k'} |r_{gk'}|` (signs kept; a logit method's unattributed terms are not passed on).
With :math:`s` the span's scores over keys, :math:`P` the restriction to the prompt's keys (source tokens of an
encoder–decoder, the prompt of a decoder-only model) and :math:`G` to the generated keys, hop :math:`h` contributes
:math:`P\,(s\,(G W)^h)` to the prompt; after :math:`H` hops the scores are
:math:`\sum_{h=0}^{H} P\,(s (GW)^h) + G\,(s (GW)^H)`: what is still on generated tokens after the last hop stays
there. Each hop moves the score of every generated token at once (one matrix product); :math:`W` is strictly lower
triangular, so hops beyond the number of generated tokens change nothing. For maps, whose rows are non-negative and
sum to 1, a hop keeps the span's total; for signed scores it keeps it where a row's signs agree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .results import LayerMaps, LogitScores


@dataclass
class SpanRows:
    """Which decoder positions (rows) make each span, for a batch.

    Attributes:
        members: ``(B, N, T)`` 0/1 (float): position ``t`` predicts a token of span ``n``; a sentence with fewer spans
            than the batch's most has empty ones.
    """

    members: torch.Tensor

    @property
    def positions(self) -> torch.Tensor:
        """``(B, T)`` booleans: the positions any span reads."""
        return self.members.sum(1) > 0

    def summed(self, scores: torch.Tensor) -> torch.Tensor:
        """``(B, [slots,] T, X)`` rows → ``(B, [slots,] N, X)``: each span's rows summed."""
        members = self.members.to(scores.dtype)
        if scores.dim() == 4:
            return torch.einsum("bnt,bltx->blnx", members, scores)
        return torch.einsum("bnt,btx->bnx", members, scores)

    def averaged(self, scores: torch.Tensor) -> torch.Tensor:
        """``(B, [slots,] T, X)`` rows → ``(B, [slots,] N, X)``: each span's mean row (empty spans: 0)."""
        members = self.members / self.members.sum(-1, keepdim=True).clamp(min=1)
        return SpanRows(members).summed(scores)

    def per_span(self, values: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` per-position values (a logit, a term) → ``(B, N)`` sums over each span."""
        return torch.einsum("bnt,bt->bn", self.members.to(values.dtype), values)

    def reduce(self, result: LayerMaps | LogitScores) -> LayerMaps | LogitScores:
        """A method's per-position result as one row per span (see the module docstring): logit scores summed, maps
        averaged; the query axis of every field becomes the spans."""
        if isinstance(result, LogitScores):
            softcap = result.logit_after_softcap
            return replace(
                result,
                target=self.summed(result.target),
                source=None if result.source is None else self.summed(result.source),
                logit=self.per_span(result.logit),
                terms={name: self.per_span(value) for name, value in result.terms.items()},
                logit_after_softcap=None if softcap is None else self.per_span(softcap),
            )
        positions = {}  # per-position values (B, T[, X]) averaged like the rows: a sink's share becomes each span's
        for name, value in result.positions.items():  # (NaN marks rows not computed, never a span's)
            averaged = self.averaged(torch.nan_to_num(value if value.dim() == 3 else value[..., None]))
            positions[name] = averaged if value.dim() == 3 else averaged[..., 0]
        return replace(
            result,
            target=self.averaged(result.target),
            source=None if result.source is None else self.averaged(result.source),
            positions=positions,
        )


def keys_of(result: LayerMaps | LogitScores) -> torch.Tensor:
    """The scores over every key ``(B, [slots,] rows, K)``: the decoder's tokens, then an encoder–decoder's source
    tokens."""
    return result.target if result.source is None else torch.cat([result.target, result.source], dim=-1)


def hop_weights(rows: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
    """The matrix :math:`GW` of the module docstring, ``(B, K, K)``: row ``g`` of a generated key is the L1-normalised
    row of the position that predicts it, ``g - 1`` (the keys are the decoder's tokens first); every other row is 0.

    Args:
        rows: ``(B, T, K)``: each decoder position's scores over the keys.
        generated: ``(B, K)`` booleans: the generated keys (decoder tokens after the first).
    """
    length, keys = rows.shape[1:]
    picked = torch.nn.functional.pad(rows[:, :-1], (0, 0, 1, keys - length))  # key g: row g - 1; source keys: 0
    norm = picked.abs().sum(-1, keepdim=True)
    weights = torch.where(norm > 0, picked / norm.clamp(min=torch.finfo(rows.dtype).tiny), torch.zeros_like(picked))
    return weights * generated[..., None].to(rows.dtype)


def hopped(scores: torch.Tensor, weights: torch.Tensor, generated: torch.Tensor, hops: int) -> torch.Tensor:
    """Each hop's contribution ``(B, N, K, hops + 1)`` from the spans' scores over keys ``(B, N, K)`` and the hop
    matrix :func:`hop_weights`: entry ``h`` is :math:`P(s (GW)^h)`, plus, for the last hop, what is left on the
    generated keys. Their sum over the last axis is the scores after ``hops`` hops."""
    prompt = (~generated)[:, None, :].to(scores.dtype)
    current, parts = scores, []
    for _ in range(hops):
        parts.append(current * prompt)
        current = torch.einsum("bnk,bkj->bnj", current * (1 - prompt), weights)
    parts.append(current)
    return torch.stack(parts, dim=-1)


def unit_scores(scores: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """Scores over keys ``(B, ..., K)`` summed over each context unit: ``members`` ``(B, U, K)`` → ``(B, ..., U)``."""
    return torch.einsum("b...k,buk->b...u", scores, members.to(scores.dtype))
