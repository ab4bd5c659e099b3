r"""Row normalisation and rollouts of per-layer context-mixing matrices.

Single stack (encoder, or decoder-only model): :math:`R^0 = C^0`, :math:`R^l = C^l R^{l-1}`. No identity is added:
the residual stream is already inside the layer matrices.

Encoder–decoders, after ALTI+ (Ferrando et al., EMNLP 2022, "Towards Opening the Black Box of Neural Machine
Translation"): with the encoder rollout :math:`R_{enc}` and each decoder layer's joint matrix
:math:`C^l = [C^l_x, C^l_y]` (source block ``T×S``, target block ``T×T``),

.. math::
    R^0 = [C^0_x R_{enc},\; C^0_y], \qquad
    R^l = \mathrm{rownorm}\big([C^l_x R_{enc} + C^l_y R^{l-1}_x,\; C^l_y R^{l-1}_y]\big).
"""

from collections.abc import Callable

import torch


def normalize_rows(scores: torch.Tensor) -> torch.Tensor:
    """Divide each row (last axis) by its sum; rows summing to 0 (padding) stay 0."""
    sums = scores.sum(-1, keepdim=True)
    return torch.where(sums > 0, scores / torch.where(sums > 0, sums, 1), torch.zeros_like(scores))


def normalize_rows_(scores: torch.Tensor) -> torch.Tensor:
    """:func:`normalize_rows` in place (no temporary of the scores' size): ``scores`` returned."""
    sums = scores.sum(-1, keepdim=True)
    positive = sums > 0
    return scores.div_(torch.where(positive, sums, 1)).masked_fill_(~positive, 0.0)


def rollout(layers: torch.Tensor) -> torch.Tensor:
    """Rollout at every depth of per-layer matrices ``(batch, layers, n, n)``; returns the same shape."""
    result = [layers[:, 0]]
    for depth in range(1, layers.shape[1]):
        result.append(layers[:, depth] @ result[-1])
    return torch.stack(result, dim=1)


def rolled_out_rows(layer_map: Callable[[int, int], torch.Tensor], layers: int, first_row: int = 0) -> torch.Tensor:
    """The rollout through every layer, :math:`C^{L-1} \\cdots C^0` (:func:`rollout`'s last depth), its rows from
    ``first_row`` on (the others 0), computed top-down: ``layer_map(l, first)`` gives layer ``l``'s map from row
    ``first`` on ``(batch, n - first, n)`` (the last layer's from ``first_row``, the others' whole), asked for once
    per layer, from the last, and dropped after one product with the rows, so that one layer's map is held at a time
    (not every layer's and every depth's rollout) and each product is ``(n - first_row) × n × n``."""
    rows = layer_map(layers - 1, first_row)
    for layer in range(layers - 2, -1, -1):
        rows = rows @ layer_map(layer, 0)
    return torch.nn.functional.pad(rows, (0, 0, first_row, 0))


def encoder_decoder_rollout(
    encoder_rollout: torch.Tensor, source_blocks: torch.Tensor, target_blocks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ALTI+-style joint rollout through the decoder, at every depth.

    Args:
        encoder_rollout: Final encoder rollout :math:`R_{enc}`, ``(batch, S, S)``.
        source_blocks: :math:`C^l_x`, ``(batch, layers, T, S)``.
        target_blocks: :math:`C^l_y`, ``(batch, layers, T, T)``.

    Returns:
        Source relevance ``(batch, layers, T, S)`` and target-prefix relevance ``(batch, layers, T, T)``; at each
        depth the two blocks of a row sum to 1 together.
    """
    num_source = encoder_rollout.shape[-1]
    source = source_blocks[:, 0] @ encoder_rollout
    target = target_blocks[:, 0]
    sources, targets = [source], [target]
    for depth in range(1, source_blocks.shape[1]):
        source_next = source_blocks[:, depth] @ encoder_rollout + target_blocks[:, depth] @ source
        target_next = target_blocks[:, depth] @ target
        joint = normalize_rows(torch.cat([source_next, target_next], dim=-1))
        source, target = joint[..., :num_source], joint[..., num_source:]
        sources.append(source)
        targets.append(target)
    return torch.stack(sources, dim=1), torch.stack(targets, dim=1)


def joint_rollout(
    encoder_layers: torch.Tensor, source_blocks: torch.Tensor, target_blocks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole encoder–decoder rollout (every method that rolls out an encoder–decoder calls this): the encoder's
    layer maps ``(batch, layers, S, S)`` rolled out, then :func:`encoder_decoder_rollout` through the decoder.

    Returns:
        The final encoder rollout ``(batch, S, S)``, and the source and target relevances at every decoder depth.
    """
    encoder = rollout(encoder_layers)[:, -1]
    source, target = encoder_decoder_rollout(encoder, source_blocks, target_blocks)
    return encoder, source, target
