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
where they are.

Idefics3's and SmolVLM's pixel shuffle folds the patches :math:`g_{k1}, \ldots, g_{kn}` into token :math:`k` by one
bias-free linear map of their concatenation, so its embedding is exactly a sum of one part per patch,
:math:`e_k = \sum_j W_j x_{g_{kj}}` (:math:`x` the tower's final states). The merge is decomposed, not averaged: each
part's share is ALTI's proximity to the whole, :math:`c_{kj} = \max(0, \lVert e_k\rVert_1 - \lVert e_k - W_j
x_{g_{kj}}\rVert_1)`, normalised over :math:`j` (a token none of whose parts is closer to it than the origin splits
evenly: our definition), and patch :math:`p` gets :math:`\sum_{k, j: g_{kj} = p} s_k c_{kj}` before the tower's
rollout spreads it; the total is kept. Gemma 3 averages each 4 × 4 block of patches (2 × 2 in the tiny model), then
applies an RMSNorm and a bias-free projection: each patch's part is its share of the mean through the RMSNorm at the
mean's statistics and the projection, exact, with the same shares.

InternVL's projector is an MLP on the concatenation (a LayerNorm, a linear map, GELU, a linear map): its parts are
DecompX's (Modarressi et al., 2023), each slot's part carried through the LayerNorm at the concatenation's statistics
(its shift, and the biases, given to no patch), the activation linearised at the true pre-activation through the
origin (:math:`f(h)/h`, DecompX's), so that the parts add up to the embedding minus that bias path; the shares are
their proximities as above. Qwen2-VL's, Qwen2.5-VL's and Qwen3.5's mergers are the same MLP on the concatenation of
each 2 × 2 unit's patches, but normalise each patch before it (a LayerNorm, Qwen2.5-VL's an RMSNorm): a slot is its
patch's normalised state exactly (the norm's shift belongs to that patch), the rest as InternVL's. Their towers run
every image as one packed sequence; the trace reads each image alone through the model's modules
(:mod:`inseq_mixing.specs.packed_tower`), Qwen2.5-VL's windows as masks. Qwen3-VL's tower is not treated: its
DeepStack adds earlier blocks' merged states to the decoder's, so an image token's score is not its embedding's alone.
"""

import torch

from ..specs.base import PatchMerge, linear_in_out
from ..trace import ModelTrace, TraceError
from .alti import alti, proximity
from .blocks import upcast
from .norms import freeze_norm
from .rollout import rolled_out_rows


def tower_rollout(trace: ModelTrace, layers: int) -> torch.Tensor:
    """The ALTI rollout of a traced vision tower through its first ``layers`` blocks ``(images, tokens, tokens)``:
    row :math:`i` is what token :math:`i`'s state after those blocks is made of, over the tower's input tokens (the
    identity for ``layers = 0``)."""
    tokens = trace.decoder.mask.shape[1]
    if layers == 0:
        return torch.eye(tokens, device=trace.decoder.mask.device).expand(trace.decoder.mask.shape[0], -1, -1)
    maps = alti(trace, decoder_layers=layers).decoder  # (images, layers, tokens, tokens), rows summing to 1
    return rolled_out_rows(lambda layer, first: maps[:, layer, first:], layers)


def merge_parts(states: torch.Tensor, merge: PatchMerge) -> torch.Tensor:
    """Each image token's embedding as one part per patch it folds, ``(images, K, n, E)`` (see the module docstring:
    exact for a bias-free linear projector; an MLP's parts add up to its output minus its bias path): ``states`` the
    tower's states the projector read ``(images, patches, D)``."""
    states = upcast(states)
    groups = merge.groups_of(states.shape[1]).to(states.device)
    count, width = groups.shape[1], states.shape[-1]
    folded = states[:, groups]  # (images, K, n, D)
    if merge.norm is not None and merge.patch_norm:  # each patch's own norm: its slot is its normalised state, exact
        folded = merge.norm(folded.to(merge.norm.weight.dtype)).to(folded.dtype)
    if merge.pool == "mean":  # each patch's share of the mean the projector read
        slots, whole = folded / count, folded.mean(2)
    else:
        slots = folded.new_zeros(*folded.shape[:2], count, count * width)  # each patch alone in its slot
        for slot in range(count):
            slots[:, :, slot, slot * width : (slot + 1) * width] = folded[:, :, slot]
        whole = folded.flatten(2)  # (images, K, n · D): the concatenation the projector read
    if merge.norm is not None and not merge.patch_norm:
        frozen = freeze_norm(merge.norm, whole)
        slots = frozen.linear(slots)
        whole = merge.norm(whole.to(merge.norm.weight.dtype)).to(whole.dtype)
    projection = merge.projection
    weight = projection if isinstance(projection, torch.Tensor) else linear_in_out(projection)[0]
    parts = slots @ upcast(weight).to(slots.device)  # (images, K, n, hidden): no bias, no norm shift
    if merge.activation is not None:
        pre = upcast(merge.projection(whole.to(weight.dtype)))  # the true pre-activation
        slope = (upcast(merge.activation(pre)) / pre).masked_fill_(pre == 0, 0)  # f(h) / h, 0 at h = 0
        parts = parts * slope[:, :, None]
        if merge.out is not None:
            out_weight, _ = linear_in_out(merge.out)
            parts = parts @ upcast(out_weight).to(parts.device)
    return parts


def merge_shares(states: torch.Tensor, merge: PatchMerge) -> torch.Tensor:
    """Each image token's shares over the patches it folds, ``(images, K, n)``, non-negative and summing to 1 over
    ``n``: its parts' proximities to their sum (:func:`merge_parts`; see the module docstring)."""
    parts = merge_parts(states, merge)
    shares = proximity(parts.sum(2), parts)  # overwrites the parts, read no further
    total = shares.sum(-1, keepdim=True)
    return torch.where(total > 0, shares / total.clamp(min=torch.finfo(shares.dtype).tiny), 1 / parts.shape[2])


def through_tower(scores: torch.Tensor, rollout: torch.Tensor, first_feature: int,
                  merge: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
    """Image-token scores ``(..., K)`` of one image continued onto the tower's input tokens ``(..., N)``: token
    ``k``'s score spread by the rollout's row ``k + first_feature`` (the tower token the projector read for it;
    ``rollout`` ``(N, N)`` for that image); with ``merge`` (that image's shares ``(K, n)`` and the groups ``(K, n)``),
    first spread over the patches each token folds (:func:`merge_shares`)."""
    if merge is not None:
        shares, groups = merge
        spread = scores[..., :, None] * shares.to(scores.dtype)  # (..., K, n)
        placed = scores.new_zeros(*scores.shape[:-1], rollout.shape[-1] - first_feature)
        scores = placed.index_add_(-1, groups.flatten().to(scores.device), spread.flatten(-2))
    rows = rollout[first_feature : first_feature + scores.shape[-1]]
    return scores @ rows.to(scores.dtype)


def check_reproduced(final: torch.Tensor, read_out: torch.nn.Module, expected: torch.Tensor) -> None:
    """Refuse a traced run of a tower whose final states of one image ``(1, tokens, D)``, through the model's merger
    ``read_out``, do not give the embeddings the model gave that image's tokens: up to the order of sums (a relative
    difference of 1e-3, 5e-2 in half precision); other blocks, or patches in another order, are far from that.

    Raises:
        TraceError: They differ more.
    """
    with torch.no_grad():
        found = read_out(final[0].to(expected.dtype))
    allowed = 5e-2 if torch.finfo(expected.dtype).bits <= 16 else 1e-3
    found, expected = upcast(found), upcast(expected).to(found.device)
    difference = float((found - expected).norm() / expected.norm().clamp(min=torch.finfo(torch.float32).tiny))
    if not difference <= allowed:
        raise TraceError(f"The vision tower's traced run gives image embeddings {difference:.2g} away from the "
                         "model's own (relative): this transformers version computes them otherwise; leave "
                         "tower=False.")  # fmt: skip
