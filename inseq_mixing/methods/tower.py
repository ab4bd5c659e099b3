r"""A vision–language decoder's image-token scores continued through the projector and the vision tower onto the
tower's input patches (**our extension**: no paper of these methods treats a vision–language model; the joint
rollout of an encoder–decoder, ALTI+'s and Abnar & Zuidema's, is the template).

In LLaVA the embedding of image token :math:`k` is the projector applied to one token's state of the tower,
:math:`e_k = P(h^{(\ell^*)}_{k'})` (:math:`\ell^*` the ``vision_feature_layer``, :math:`k' = k + 1` when the
``"default"`` strategy drops the class token): the projector mixes no tokens, so token :math:`k`'s score :math:`s_k`
belongs to tower token :math:`k'` whole. The tower's mixing up to :math:`\ell^*` is its ALTI rollout (Ferrando et al.,
2022) :math:`R = C^{\ell^*-1} \cdots C^{0}`, whose rows are non-negative and sum to 1 (:mod:`.alti`), so the scores on
the tower's input tokens (the class token, then the patches)

.. math:: r_j = \sum_k s_k\, R_{k'j}

sum to :math:`\sum_k s_k`: what the decoder gave the image is kept across the junction (signed scores stay signed:
each :math:`s_k` is spread by a row of non-negative shares). :math:`\ell^* = 0` (the tower's input) leaves the scores
where they are. A projector that merges tokens (Qwen2-VL's 2 × 2 merger, pixel shuffles, Gemma 3's pooling) would need
its own decomposition: not treated here.
"""

import torch

from ..trace import ModelTrace
from .alti import alti
from .rollout import rolled_out_rows


def tower_rollout(trace: ModelTrace, layers: int) -> torch.Tensor:
    """The ALTI rollout of a traced vision tower through its first ``layers`` blocks ``(images, tokens, tokens)``:
    row :math:`i` is what token :math:`i`'s state after those blocks is made of, over the tower's input tokens (the
    identity for ``layers = 0``)."""
    tokens = trace.decoder.mask.shape[1]
    if layers == 0:
        return torch.eye(tokens, device=trace.decoder.mask.device).expand(trace.decoder.mask.shape[0], -1, -1)
    maps = alti(trace, decoder_layers=layers).decoder  # (images, layers, tokens, tokens), rows summing to 1
    return rolled_out_rows(lambda layer: maps[:, layer], layers)


def through_tower(scores: torch.Tensor, rollout: torch.Tensor, first_feature: int) -> torch.Tensor:
    """Image-token scores ``(..., K)`` of one image continued onto the tower's input tokens ``(..., N)``: token
    ``k``'s score spread by the rollout's row ``k + first_feature`` (the tower token the projector read for it;
    ``rollout`` ``(N, N)`` for that image)."""
    rows = rollout[first_feature : first_feature + scores.shape[-1]]
    return scores @ rows.to(scores.dtype)
