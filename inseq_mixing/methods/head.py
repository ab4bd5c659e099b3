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
"""

import torch

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
    def __init__(self, head: HeadSpec, hidden: torch.Tensor):
        self.head = head
        self.frozen = []  # per step before the last: ("linear", module) | ("norm", FrozenNorm) | ("slope", (B, T, n))
        state = upcast(hidden)
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
            ``u`` ``(B, T, D)`` and ``c`` ``(B, T)`` with ``logit = u · h + c`` at every position.
        """
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
        return direction, constant


def _bias(module) -> torch.Tensor | None:
    bias = getattr(module, "bias", None)
    return None if bias is None else upcast(bias)
