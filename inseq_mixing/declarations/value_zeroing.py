"""``value_zeroing``: Value Zeroing (Mohebbi et al., EACL 2023), in closed form from one forward pass.

Zeroing the value vectors of token j in a layer changes each query's attention output by exactly
−Σ_h α^h_ij v^h_j W^h_O; the rest of the block is position-wise, so every zeroing of a layer is one batched pass
through the rest of that block (:mod:`inseq_mixing.methods.value_zeroing`). A chunk's items are zeroed tokens.
"""

from dataclasses import dataclass

from ..methods.options import NORMALIZATIONS, SIMILARITY_METRICS
from .base import Chunking, Declaration, EncoderMaps, Request, layer_axis, option


@dataclass(frozen=True)
class ValueZeroingOptions(EncoderMaps, Chunking):
    similarity_metric: str = option(
        "cosine", "Distance between corrupted and clean outputs: cosine distance (the paper's) or Euclidean.",
        SIMILARITY_METRICS,
    )  # fmt: skip
    normalization: str = option(
        "separate",
        "'separate': each map's rows sum to 1 (the paper); 'joint': encoder–decoders' source and target rows of a "
        "layer sum to 1 together.",
        NORMALIZATIONS,
    )
    rollout: bool = option(
        False, "Return the rollout across layers instead of per-layer maps (encoder–decoders: our extension)."
    )


def compute(request: Request, options: ValueZeroingOptions):
    from ..methods.value_zeroing import value_zeroing, value_zeroing_maps

    encoder = options.output_encoder_self_scores or options.rollout
    scores = value_zeroing(request.trace, options.similarity_metric, encoder, options.max_chunk_elements)
    maps = value_zeroing_maps(scores, options.normalization, options.rollout)
    if not options.rollout:
        maps.axis = layer_axis(maps.target.shape[1])
    return maps


DECLARATION = Declaration(
    name="value_zeroing",
    summary="Value Zeroing (Mohebbi et al., EACL 2023), computed in closed form from one forward pass.",
    description=(
        "Zeroing the value vectors of token j in a layer changes each query's attention output by exactly "
        "-Σ_h α^h_ij v^h_j W^h_O; the rest of the block is position-wise, so every zeroing of a layer is one batched "
        "pass through the rest of that block. Scores are the cosine (or Euclidean) distance between corrupted and "
        "clean layer outputs, rows normalised to sum to 1, with no clipping threshold.\n\n"
        "Outputs: per-layer scores (last dimension: layer). Encoder–decoders: source = cross-attention zeroing, "
        "target = decoder self-attention zeroing (with attribute_target=True, else in "
        "sequence_scores['decoder_self_scores']), encoder self-attention zeroing in "
        "sequence_scores['encoder_self_scores']. Decoder-only: target scores. With rollout=True, one rolled-out map "
        "instead of per-layer scores.\n\n"
        "This method replaces Inseq's built-in value_zeroing, which import inseq_mixing renames to "
        "inseq_value_zeroing."
    ),
    options=ValueZeroingOptions,
    compute=compute,
)
