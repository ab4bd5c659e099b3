r"""ALTI (Ferrando et al., EMNLP 2022) and ALTI+ for encoder–decoders, on a recorded forward pass.

Papers: Javier Ferrando, Gerard I. Gállego, Marta R. Costa-jussà. "Measuring the Mixing of Contextual Information in
the Transformer". EMNLP 2022. https://aclanthology.org/2022.emnlp-main.595/ ; Javier Ferrando, Gerard I. Gállego,
Belen Alastruey, Carlos Escolano, Marta R. Costa-jussà. "Towards Opening the Black Box of Neural Machine Translation:
Source and Target Interpretations of the Transformer". EMNLP 2022. https://aclanthology.org/2022.emnlp-main.599/

An attention sub-block's output at position :math:`i` is a sum of one vector per context token,

.. math:: T_i(x_j) = \sum_h \alpha^h_{ij}\, v^h_j W^h_O \;(+\, x_i \text{ if } j = i), \qquad
          y_i = \sum_j T_i(x_j) + b_O \;\text{(pre-LN)}.

Post-LN blocks apply their norm with statistics frozen at the forward pass, :math:`L_i`, to every part; its shift
:math:`\beta` and :math:`L_i(b_O)` stay outside the parts, and :math:`y_i` is the norm's real output. A norm on the
attention output (Gemma 2's sandwich, OLMo-2; our extension) is frozen the same way and applied to the attention parts
before the residual is added. The contribution of token :math:`j` is its proximity to the output,

.. math:: c_{ij} = \max\big(0,\; \lVert y_i\rVert_1 - \lVert y_i - T_i(x_j)\rVert_1\big),

with rows normalised to sum to 1. Where no part is closer to :math:`y_i` than the origin (every :math:`c_{ij} = 0`, a
case the paper leaves undefined), the row goes to position :math:`i`'s own residual stream (our definition). Layer
maps roll out as :math:`R^l = C^l R^{l-1}` (the residual is already inside
:math:`C^l`). Cross-attention (ALTI+) gives a ``T×(S+1)`` map whose last column is the decoder residual; the joint
decoder layer map is :math:`[C_{ca}[:, :S],\; \mathrm{diag}(C_{ca}[:, S])\, C_{sa}]` (see :mod:`.rollout`).

Per-head maps (our extension): the parts split by head, :math:`T^h_i(x_j) = \alpha^h_{ij} v^h_j W^h_O`, the residual
:math:`x_i` a part of its own, every part scored by the same proximity to :math:`y_i` and each row normalised over
heads, tokens and the residual together.
"""

import warnings
from dataclasses import dataclass

import torch

from ..deferred import check
from ..specs import AttentionSpec, StackSpec
from ..trace import AttentionTrace, ModelTrace, StackTrace
from .blocks import refuse_non_finite, upcast
from .norms import freeze_norm
from .parts import DEFAULT_CHUNK_ELEMENTS, head_part_scores, part_scores, stack_scores
from .results import LayerMaps
from .rollout import joint_rollout, normalize_rows, normalize_rows_, rolled_out_rows
from .rollout import rollout as rollout_stack


@dataclass
class AltiScores:
    """ALTI layer maps, rows normalised, ``(batch, layers, positions i, tokens j)``.

    Attributes:
        decoder: Decoder self-attention contributions :math:`C_{sa}` (the only map of decoder-only models).
        cross: Cross-attention contributions :math:`C_{ca}` ``(B, L, T, S + 1)``; the last column is the decoder's own
            residual stream.
        encoder: Encoder self-attention contributions ``(B, L, S, S)``.
    """

    decoder: torch.Tensor
    cross: torch.Tensor | None = None
    encoder: torch.Tensor | None = None


#: The ``eps`` of ``torch.nn.functional.pairwise_distance``, which the authors' released code measures distances with:
#: it adds it to every coordinate of the difference, :math:`\lVert T_j - y + \epsilon \mathbf{1}\rVert_1`.
REFERENCE_DISTANCE_EPS = 1e-6


def proximity(output: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    r""":math:`\max(0, \lVert y\rVert_1 - \lVert y - T_j\rVert_1)`: outputs ``(B, q, D)``, parts ``(B, q, k, D)``
    (or ``(B, q, H, k, D)``), which it overwrites (a part scorer's parts are its own: no copy of a tile)."""
    output = output.reshape(*output.shape[:2], *[1] * (parts.dim() - 3), output.shape[-1])  # parts may have heads
    whole = output.abs().sum(-1)
    rest = parts.sub_(output).abs_().sum(-1)
    return (whole - rest).clamp(min=0)


def reference_proximity(output: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    r"""The released code's proximity, :math:`\max(0, \lVert y\rVert_1 - \lVert T_j - y + \epsilon\mathbf{1}
    \rVert_1)` with :data:`REFERENCE_DISTANCE_EPS` (``convention="reference"``); overwrites ``parts`` as
    :func:`proximity` does."""
    output = output.reshape(*output.shape[:2], *[1] * (parts.dim() - 3), output.shape[-1])
    whole = output.abs().sum(-1)
    rest = parts.sub_(output).add_(REFERENCE_DISTANCE_EPS).abs_().sum(-1)
    return (whole - rest).clamp(min=0)


def contributions(
    attn: AttentionSpec,
    record: AttentionTrace,
    residual: torch.Tensor,
    self_mixing: bool,
    causal: bool,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    per_head: bool = False,
    convention: str = "paper",
    first_row: int = 0,
) -> torch.Tensor:
    r"""Unnormalised ALTI contributions of one attention sub-block (see :func:`.parts.part_scores` for the arguments):
    ``(B, Q, K)`` for self-attention, ``(B, Q, K + 1)`` for cross-attention (``first_row``: its rows from there on
    only, not with ``per_head``); with ``per_head``, one part per head and token plus the residual,
    ``(B, H + 1, Q, K[+1])`` (see :func:`.parts.head_part_scores`).

    ``convention="reference"`` follows the authors' released code (mt-upc/transformer-contributions) where it departs
    from the paper's formula: distances measured with PyTorch's ``pairwise_distance`` (:func:`reference_proximity`),
    and a post-LN block's norm scaled by :math:`1/\sigma` of its input without the norm's ``eps`` (their code adds
    ``eps`` to the input itself, where the standard deviation ignores it), the output :math:`y_i` the norm of the
    parts' sum at that scale."""
    score = head_part_scores if per_head else part_scores
    options = {"max_chunk_elements": max_chunk_elements}
    if first_row:  # the rows from it on only (not per head)
        options.update(first_row=first_row, trimmed=True)
    reference = convention == "reference"
    if attn.post_norm is not None:
        frozen = freeze_norm(attn.post_norm, record.norm_input, eps=0.0 if reference else None)
        options.update(maps=[frozen])
        if reference:  # y_i at the released code's scale: the frozen map of the norm's input, plus its shift
            shift = 0 if frozen.shift is None else frozen.shift
            options.update(output=frozen.linear(upcast(record.norm_input)) + shift)
        else:
            options.update(output=upcast(attn.post_norm(record.norm_input)))
    return score(attn, record, residual, self_mixing, causal, reference_proximity if reference else proximity,
                 **options)  # fmt: skip


def stack_contributions(
    stack_spec: StackSpec,
    stack: StackTrace,
    sub_block: str,
    key_mask: torch.Tensor,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    per_head: bool = False,
    layers: int | slice | None = None,
    convention: str = "paper",
    first_row: int = 0,
) -> torch.Tensor:
    """Normalised ALTI maps of every layer (or of the first ``layers``, or of a slice of them) of a stack for one kind
    of sub-block:
    ``(B, L, Q, K[+1])``; with ``per_head``, ``(B, L, H + 1, Q, K[+1])``, each row normalised over all heads and
    tokens and the residual (index ``H``). ``convention``: see :func:`contributions`; ``first_row``: the rows from
    there on only (self-attention, not per head)."""

    def layer_scores(_layer, _record, attn, attn_record, residual, self_mixing, causal):
        return contributions(attn, attn_record, residual, self_mixing, causal, max_chunk_elements, per_head,
                             convention, first_row)  # fmt: skip

    self_mixing = sub_block == "self"
    maps = stack_scores(stack_spec, stack, sub_block, key_mask, layer_scores, layers=layers)
    if per_head:  # a row spans (heads, tokens): normalise it as one
        heads = maps.shape[2]
        flat = maps.permute(0, 1, 3, 2, 4).flatten(3)  # (B, L, Q, (H + 1)·K)
        own = torch.zeros_like(maps[:, 0])
        own[:, -1] = own_rows(maps[:, 0, -1], self_mixing)  # the residual slot
        own = own.transpose(1, 2).flatten(2)
        rows = [
            normalize_rows(fill_empty_rows(flat[:, layer], stack.mask, self_mixing, own))
            for layer in range(maps.shape[1])
        ]
        return torch.stack(rows, dim=1).unflatten(-1, (heads, -1)).transpose(2, 3)
    for layer in range(maps.shape[1]):  # in place: at long lengths a layer's map is the largest tensor held
        normalize_rows_(fill_empty_rows_(maps[:, layer], stack.mask, self_mixing, first_row))
    return maps


def fill_empty_rows(
    scores: torch.Tensor, query_mask: torch.Tensor, self_mixing: bool, own: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows where no part is closer to the output than the origin: the paper's normalisation is undefined there.

    Such a position is given to its own residual stream (self-attention: the diagonal; cross-attention: the residual
    column; ``own`` gives these rows for other layouts), i.e. no measurable mixing: rows still sum to 1 and the
    rollout keeps the mass where it was. A warning says how many rows this happened to. Non-finite raw contributions
    are refused.
    """
    refuse_non_finite("ALTI", scores)
    empty = (scores.sum(-1) == 0) & query_mask
    check(empty.sum(), warn_empty_rows)  # read with the other checks: no host–device synchronisation here
    own = own_rows(scores, self_mixing) if own is None else own
    return torch.where(empty[..., None], own, scores)


def fill_empty_rows_(scores: torch.Tensor, query_mask: torch.Tensor, self_mixing: bool,
                     first_row: int = 0) -> torch.Tensor:  # fmt: skip
    """:func:`fill_empty_rows` in place, for rows over tokens (``(B, Q, K)``, or its rows from ``first_row`` on): an
    empty row's own cell (the diagonal, or the residual column) set to 1, no temporary of the scores' size; ``scores``
    returned."""
    if self_mixing and scores.shape[-2] + first_row != scores.shape[-1]:
        return scores.copy_(fill_empty_rows(scores, query_mask, self_mixing))
    refuse_non_finite("ALTI", scores)
    empty = (scores.sum(-1) == 0) & query_mask[:, first_row:]
    check(empty.sum(), warn_empty_rows)
    scores.masked_fill_(empty[..., None], 0.0)  # as the identity row replaces it whole
    own = scores.diagonal(offset=first_row, dim1=-2, dim2=-1) if self_mixing else scores[..., -1]
    own.masked_fill_(empty, 1.0)
    return scores


def warn_empty_rows(count: int) -> None:
    if count:
        warnings.warn(
            f"ALTI: {count} position(s) had no token closer to the output than the origin (undefined in the paper); "
            "each is attributed to its own residual stream (an identity row).",
            stacklevel=2,
        )


def own_rows(like: torch.Tensor, self_mixing: bool) -> torch.Tensor:
    """Rows ``(..., Q, K)`` that give each position to its own residual stream: the diagonal (self-attention) or the
    residual column, the last (cross-attention)."""
    own = torch.zeros_like(like)
    if self_mixing:
        own.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    else:
        own[..., -1] = 1.0
    return own


@torch.no_grad()
def alti(
    trace: ModelTrace,
    encoder_scores: bool = True,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    per_head: bool = False,
    decoder_layers: int | None = None,
    convention: str = "paper",
):
    """ALTI maps of every layer and attention sub-block of a traced model.

    Args:
        trace: A recorded forward pass.
        encoder_scores: Also compute the encoder maps (encoder–decoders; the rollouts need them).
        max_chunk_elements: Memory bound of one chunk of parts.
        per_head: Split every part by attention head, the residual a part of its own (our extension, see
            :func:`stack_contributions`): maps ``(B, L, H + 1, i, j)``, index ``H`` the residual. These maps do not
            roll out.
        decoder_layers: Only the first layers of the decoder (the encoder's maps are all computed).
        convention: ``"paper"`` (the formula above) or ``"reference"`` (the authors' released code, see
            :func:`contributions`).

    Returns:
        :class:`AltiScores`.
    """
    spec, dec, enc = trace.spec, trace.decoder, trace.encoder

    def maps(stack_spec, stack, sub_block, key_mask, layers=None):
        return stack_contributions(stack_spec, stack, sub_block, key_mask, max_chunk_elements, per_head, layers,
                                   convention)  # fmt: skip

    scores = AltiScores(decoder=maps(spec.decoder, dec, "self", dec.mask, decoder_layers))
    if spec.is_encoder_decoder:
        scores.cross = maps(spec.decoder, dec, "cross", enc.mask, decoder_layers)
        if encoder_scores:
            scores.encoder = maps(spec.encoder, enc, "self", enc.mask)
    return scores


@torch.no_grad()
def alti_rollout(trace: ModelTrace, first_row: int = 0, max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
                 convention: str = "paper") -> LayerMaps:  # fmt: skip
    """The ALTI rollout of a decoder-only or encoder-only model, its rows from ``first_row`` on (the others 0, read by
    nothing), one layer's map at a time (:func:`.rollout.rolled_out_rows`): what :func:`alti_maps` of :func:`alti`
    gives there, without every layer's maps and every depth's rollout."""
    spec, stack = trace.spec, trace.decoder

    def layer_map(index: int, first: int) -> torch.Tensor:
        return stack_contributions(spec.decoder, stack, "self", stack.mask, max_chunk_elements,
                                   layers=slice(index, index + 1), convention=convention,
                                   first_row=first)[:, 0]  # fmt: skip

    return LayerMaps(target=rolled_out_rows(layer_map, len(spec.decoder.layers), first_row))


def joint_layer_blocks(scores: AltiScores) -> tuple[torch.Tensor, torch.Tensor]:
    r"""ALTI+ decoder layer maps :math:`C_x = C_{ca}[:, :S]` and :math:`C_y = \mathrm{diag}(C_{ca}[:, S]) C_{sa}`.

    Per-head maps ``(B, L, H + 1, T, ·)``: the source block keeps the cross-attention heads, the target block scales
    the self-attention heads by the cross-attention residual's share (summed over the head axis).
    """
    source = scores.cross[..., :-1]
    residual_share = scores.cross[..., -1:]
    if scores.cross.dim() == 5:
        residual_share = residual_share.sum(2, keepdim=True)
    return source, residual_share * scores.decoder


@dataclass
class AltiRollouts:
    """Rollouts at every depth.

    Attributes:
        target: ``(B, L, T, T)``: relevance of target tokens for the decoder state after each layer.
        source: ``(B, L, T, S)``: relevance of source tokens (encoder–decoders).
        encoder: ``(B, S, S)``: the final encoder rollout (encoder–decoders).
    """

    target: torch.Tensor
    source: torch.Tensor | None = None
    encoder: torch.Tensor | None = None


def alti_rollouts(scores: AltiScores) -> AltiRollouts:
    """Roll the layer maps out through the model: plain rollout, or ALTI+ for encoder–decoders."""
    if scores.cross is None:
        return AltiRollouts(target=rollout_stack(scores.decoder))
    if scores.encoder is None:
        raise ValueError("The encoder–decoder rollout needs the encoder maps: compute them with encoder_scores=True.")
    encoder, source, target = joint_rollout(scores.encoder, *joint_layer_blocks(scores))
    return AltiRollouts(target=target, source=source, encoder=encoder)


def alti_maps(scores: AltiScores, rollout: bool = True) -> LayerMaps:
    """Per-layer ALTI maps (encoder–decoders: the joint ALTI+ layer blocks) or their final rollout.

    Args:
        scores: Layer maps from :func:`alti`.
        rollout: Return the rollout through all layers (ALTI / ALTI+) instead of the layer maps.
    """
    encoder = scores.encoder
    if rollout and scores.decoder.dim() == 5:
        raise ValueError("Per-head ALTI maps do not roll out: ask for per-layer maps (per_layer=True).")
    if rollout:
        rolled = alti_rollouts(scores)
        source = None if rolled.source is None else rolled.source[:, -1]
        return LayerMaps(target=rolled.target[:, -1], source=source, encoder=rolled.encoder)
    if scores.cross is None:
        return LayerMaps(target=scores.decoder)
    source, target = joint_layer_blocks(scores)
    return LayerMaps(target=target, source=source, encoder=encoder)
