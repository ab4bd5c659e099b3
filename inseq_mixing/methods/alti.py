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
"""

import warnings
from dataclasses import dataclass

import torch

from ..specs import AttentionSpec, StackSpec
from ..trace import AttentionTrace, ModelTrace, StackTrace
from .blocks import refuse_non_finite, upcast
from .norms import freeze_norm
from .parts import DEFAULT_CHUNK_ELEMENTS, part_scores, stack_scores
from .rollout import encoder_decoder_rollout, normalize_rows
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


@dataclass
class AltiMaps:
    """ALTI maps per layer ``(B, L, i, j)`` or rolled out ``(B, i, j)``.

    Attributes:
        target: Relevance of target-prefix tokens (decoder-only: the whole sequence).
        source: Relevance of source tokens (encoder–decoders).
        encoder: Encoder self-attention map (encoder–decoders).
    """

    target: torch.Tensor
    source: torch.Tensor | None = None
    encoder: torch.Tensor | None = None


def proximity(output: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    r""":math:`\max(0, \lVert y\rVert_1 - \lVert y - T_j\rVert_1)`: outputs ``(B, q, D)``, parts ``(B, q, k, D)``."""
    whole = output.abs().sum(-1, keepdim=True)
    rest = (output[:, :, None] - parts).abs().sum(-1)
    return (whole - rest).clamp(min=0)


def contributions(
    attn: AttentionSpec,
    record: AttentionTrace,
    residual: torch.Tensor,
    self_mixing: bool,
    causal: bool,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Unnormalised ALTI contributions of one attention sub-block (see :func:`.parts.part_scores` for the arguments):
    ``(B, Q, K)`` for self-attention, ``(B, Q, K + 1)`` for cross-attention."""
    if attn.post_norm is None:
        return part_scores(
            attn, record, residual, self_mixing, causal, proximity, max_chunk_elements=max_chunk_elements
        )
    frozen = freeze_norm(attn.post_norm, record.norm_input)
    output = upcast(attn.post_norm(record.norm_input))
    return part_scores(
        attn, record, residual, self_mixing, causal, proximity, maps=[frozen], output=output,
        max_chunk_elements=max_chunk_elements,
    )  # fmt: skip


def stack_contributions(
    stack_spec: StackSpec,
    stack: StackTrace,
    sub_block: str,
    key_mask: torch.Tensor,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Normalised ALTI maps of every layer of a stack for one kind of sub-block: ``(B, L, Q, K[+1])``."""

    def layer_scores(_layer, _record, attn, attn_record, residual, self_mixing, causal):
        return contributions(attn, attn_record, residual, self_mixing, causal, max_chunk_elements)

    self_mixing = sub_block == "self"
    maps = stack_scores(stack_spec, stack, sub_block, key_mask, layer_scores)
    rows = [normalize_rows(fill_empty_rows(maps[:, layer], stack.mask, self_mixing)) for layer in range(maps.shape[1])]
    return torch.stack(rows, dim=1)


def fill_empty_rows(scores: torch.Tensor, query_mask: torch.Tensor, self_mixing: bool) -> torch.Tensor:
    """Rows where no part is closer to the output than the origin: the paper's normalisation is undefined there.

    Such a position is given to its own residual stream (self-attention: the diagonal; cross-attention: the residual
    column), i.e. no measurable mixing: rows still sum to 1 and the rollout keeps the mass where it was. A warning
    says how many rows this happened to. Non-finite raw contributions are refused.
    """
    refuse_non_finite("ALTI", scores)
    empty = (scores.sum(-1) == 0) & query_mask
    if not empty.any():
        return scores
    warnings.warn(
        f"ALTI: {int(empty.sum())} position(s) had no token closer to the output than the origin (undefined in the "
        "paper); each is attributed to its own residual stream (an identity row).",
        stacklevel=2,
    )
    own = torch.zeros_like(scores)
    if self_mixing:
        own.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    else:
        own[..., -1] = 1.0
    return torch.where(empty[..., None], own, scores)


@torch.no_grad()
def alti(trace: ModelTrace, encoder_scores: bool = True, max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS):
    """ALTI maps of every layer and attention sub-block of a traced model.

    Args:
        trace: A recorded forward pass.
        encoder_scores: Also compute the encoder maps (encoder–decoders; the rollouts need them).
        max_chunk_elements: Memory bound of one chunk of parts.

    Returns:
        :class:`AltiScores`.
    """
    spec, dec, enc = trace.spec, trace.decoder, trace.encoder
    scores = AltiScores(decoder=stack_contributions(spec.decoder, dec, "self", dec.mask, max_chunk_elements))
    if spec.is_encoder_decoder:
        scores.cross = stack_contributions(spec.decoder, dec, "cross", enc.mask, max_chunk_elements)
        if encoder_scores:
            scores.encoder = stack_contributions(spec.encoder, enc, "self", enc.mask, max_chunk_elements)
    return scores


def joint_layer_blocks(scores: AltiScores) -> tuple[torch.Tensor, torch.Tensor]:
    r"""ALTI+ decoder layer maps :math:`C_x = C_{ca}[:, :S]` and :math:`C_y = \mathrm{diag}(C_{ca}[:, S]) C_{sa}`."""
    source = scores.cross[..., :-1]
    target = scores.cross[..., -1:] * scores.decoder
    return source, target


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
    encoder = rollout_stack(scores.encoder)[:, -1]
    source, target = encoder_decoder_rollout(encoder, *joint_layer_blocks(scores))
    return AltiRollouts(target=target, source=source, encoder=encoder)


def alti_maps(scores: AltiScores, rollout: bool = True) -> AltiMaps:
    """Per-layer ALTI maps (encoder–decoders: the joint ALTI+ layer blocks) or their final rollout.

    Args:
        scores: Layer maps from :func:`alti`.
        rollout: Return the rollout through all layers (ALTI / ALTI+) instead of the layer maps.
    """
    encoder = scores.encoder
    if rollout:
        rolled = alti_rollouts(scores)
        source = None if rolled.source is None else rolled.source[:, -1]
        return AltiMaps(target=rolled.target[:, -1], source=source, encoder=rolled.encoder)
    if scores.cross is None:
        return AltiMaps(target=scores.decoder)
    source, target = joint_layer_blocks(scores)
    return AltiMaps(target=target, source=source, encoder=encoder)
