r"""An encoder model's read-out head, frozen at the forward pass: an affine map of the final hidden state.

Heads between the last hidden state and a masked LM's or a classifier's logit are not linear: BERT's MLM transform
(dense, GELU, LayerNorm), the poolers' tanh, RoBERTa's and ELECTRA's classification heads, DistilBERT's ReLU. As
DecompX does for the pooler (Modarressi et al., ACL 2023), each element-wise activation :math:`f` becomes its slope
:math:`f(z)/z` at the true pre-activation :math:`z` of the explained position, and each norm its affine map at the
frozen statistics (:mod:`.norms`). The head is then affine in the final hidden state :math:`h` of that position:
:math:`\mathrm{logit}_w = u \cdot h + c`, exactly at the forward pass, with :math:`u` the head's linear part carried
back from the output row :math:`W_w` (:math:`W_w - W_{foil}` for a contrast) and :math:`c` the biases and norm shifts
along the way. So every logit method explains a masked LM's or a classifier's logit exactly. Freezing the head is
DecompX's own treatment; for ALTI-logit and AttnLRP it is our extension (for AttnLRP it is the same as its identity
rule on activations and norms).

A pooled read-out (an image classifier reading the mean of the patches' final states, or [CLS] beside it;
:class:`~inseq_mixing.specs.HeadSpec`) is frozen at the pooled vector. Pooling is linear, so the logit is
:math:`\sum_t u_t \cdot h_t + c`, with :math:`u_t` the direction on the pooled vector sent back to each position it
reads (:func:`spread`): :math:`u/n` on each of the :math:`n` averaged states, the [CLS] part of :math:`u` on [CLS]
(DeiT's distillation part on [DIST]).
A logit method's per-position result along :math:`u_t` is position :math:`t`'s share of the logit; the shares summed
(:func:`pooled_scores`) are the logit's decomposition, exactly, because every method is linear in the direction it
starts from (**our extension**: the papers read one position).
"""

import dataclasses

import torch
from torch import nn

from ..specs.base import HeadSpec, is_norm
from .blocks import upcast
from .norms import freeze_norm


class FrozenHead:
    """A :class:`~inseq_mixing.specs.HeadSpec` frozen at the final hidden states ``(B, T, D)`` of every position.

    Args:
        head: The head's steps.
        hidden: The final hidden states the head read at the forward pass.
    """

    @torch.no_grad()
    def __init__(self, head: HeadSpec, hidden: torch.Tensor, mask: torch.Tensor | None = None):
        self.head, self.mask = head, mask
        self.frozen = []  # per step before the last: ("linear", module) | ("norm", FrozenNorm) | ("slope", (B, T, n))
        self.length, self.width = hidden.shape[1], hidden.shape[-1]
        state = upcast(head.pooled(hidden, mask))
        for step in head.steps[:-1]:
            if isinstance(step, torch.nn.Linear):
                self.frozen.append(("linear", step))
                state = torch.nn.functional.linear(state, upcast(step.weight), _bias(step))
            elif is_norm(step):
                frozen = freeze_norm(step, state)
                self.frozen.append(("norm", frozen))
                state = frozen.linear(state) + (0 if frozen.shift is None else frozen.shift)
            else:
                out = upcast(step(state))
                slope = torch.where(state == 0, torch.zeros_like(out), out / torch.where(state == 0, 1, state))
                self.frozen.append(("slope", slope))
                state = slope * state

    @torch.no_grad()
    def readout(self, ids: torch.Tensor, foil_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The direction on the final hidden state and the constant of the logit of ``ids`` (minus ``foil_ids``'s)
        at every position.

        Args:
            ids: ``(B, T)`` output indices (vocabulary ids or labels).
            foil_ids: ``(B, T)`` contrast indices, or None.

        Returns:
            ``u`` ``(B, T, D)`` and ``c`` ``(B, T)`` with ``logit = u · h + c`` at every position; for a pooled
            read-out, the logit of ``ids[:, 0]`` (the one the model gives) is ``(u · h).sum() + c[:, 0]``, with
            ``u`` :func:`spread` over the positions it reads and ``c`` 0 beyond position 0.
        """
        if self.head.pooling:
            ids, foil_ids = ids[:, :1], None if foil_ids is None else foil_ids[:, :1]
        out_proj = self.head.out_proj
        weight, bias = upcast(out_proj.weight), _bias(out_proj)
        direction = weight[ids] - (0 if foil_ids is None else weight[foil_ids])
        constant = torch.zeros(ids.shape, dtype=direction.dtype, device=direction.device)
        if bias is not None:
            constant = constant + bias[ids] - (0 if foil_ids is None else bias[foil_ids])
        for kind, frozen in reversed(self.frozen):
            if kind == "linear":
                step_bias = _bias(frozen)
                if step_bias is not None:
                    constant = constant + direction @ step_bias
                direction = direction @ upcast(frozen.weight)
            elif kind == "norm":
                if frozen.shift is not None:
                    constant = constant + direction @ frozen.shift
                direction = frozen.transpose(direction)
            else:
                direction = direction * frozen
        if self.head.pooling:
            spread_out = spread(self.head, direction, self.length, self.width, self.mask)
            return spread_out, nn.functional.pad(constant, (0, self.length - 1))
        return direction, constant


def spread(head: HeadSpec, direction: torch.Tensor, length: int, width: int, mask: torch.Tensor | None = None
           ) -> torch.Tensor:  # fmt: skip
    """A direction on a pooled read-out's vector ``(B, 1, D · len(pooling))`` as directions on the final states of
    the ``length`` positions ``(B, T, D)`` (``mask``: the real ones, in a padded batch): the transpose of
    :meth:`~inseq_mixing.specs.HeadSpec.pooled`."""
    spread_out = direction.new_zeros(direction.shape[0], length, width)
    weights = head.mean_weights((direction.shape[0], length), mask, direction.device).to(direction.dtype)
    for index, name in enumerate(head.pooling):
        part = direction[:, 0, index * width : (index + 1) * width]
        if name == "mean":
            spread_out += weights[..., None] * part[:, None]
        else:
            spread_out[:, name] += part
    return spread_out


def summed_into_first(scores: torch.Tensor | None, axis: int) -> torch.Tensor | None:
    """A pooled read-out's per-position shares ``scores`` summed along the positions ``axis`` into position 0, the
    other positions 0 (None stays None)."""
    if scores is None:
        return None
    pooled = torch.zeros_like(scores)
    pooled.narrow(axis, 0, 1).copy_(scores.sum(axis, keepdim=True))
    return pooled


def pooled_scores(result):
    """A pooled read-out's :class:`~.results.LogitScores` from the per-position shares a logit method returns (see
    the module docstring): every share summed into position 0, whose ``logit`` is the model's; the other rows 0.
    Idempotent (a result already pooled is returned equal)."""
    first_only = torch.zeros_like(result.logit)
    first_only[:, 0] = result.logit[:, 0]
    return dataclasses.replace(
        result,
        target=summed_into_first(result.target, -2),
        source=summed_into_first(result.source, -2),
        terms={name: summed_into_first(term, -1) for name, term in result.terms.items()},
        logit=first_only,
    )


def _bias(module) -> torch.Tensor | None:
    bias = getattr(module, "bias", None)
    return None if bias is None else upcast(bias)
