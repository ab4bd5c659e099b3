"""Inseq glue for Value Zeroing: registered as ``value_zeroing``, replacing Inseq's built-in (renamed)."""

from ..methods.value_zeroing import (
    DEFAULT_CHUNK_ELEMENTS,
    NORMALIZATIONS,
    SIMILARITY_METRICS,
    value_zeroing,
    value_zeroing_maps,
)
from .base import ContextMixingAttribution, MethodCall, MixingStepOutput, read_step_inputs


class _ValueZeroing(MethodCall):
    choices = {"similarity_metric": SIMILARITY_METRICS, "normalization": NORMALIZATIONS}

    def attribute(
        self,
        inputs,
        additional_forward_args,
        similarity_metric: str = "cosine",
        normalization: str = "separate",
        rollout: bool = False,
        output_encoder_self_scores: bool = True,
        max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ) -> MixingStepOutput:
        """Value Zeroing scores of every layer for every generated token.

        Args:
            similarity_metric: ``"cosine"`` (cosine distance, the paper's) or ``"euclidean"``.
            normalization: ``"separate"`` (each map's rows sum to 1, as in the paper) or ``"joint"``
                (encoder–decoders: source and target rows of a layer sum to 1 together).
            rollout: Return the rollout across layers instead of per-layer scores (encoder–decoders: ALTI+-style
                joint rollout, our extension).
            output_encoder_self_scores: Compute the encoder self-attention scores (encoder–decoders).
            max_chunk_elements: Elements of one chunk's FFN activations (batch × zeroed tokens × positions ×
                4·d_model); at least one zeroed token per chunk.
        """
        owner = self.owner
        steps = read_step_inputs(inputs, additional_forward_args, owner.spec.is_encoder_decoder)
        trace = owner.trace(steps)
        scores = value_zeroing(trace, similarity_metric, output_encoder_self_scores or rollout, max_chunk_elements)
        maps = value_zeroing_maps(scores, normalization, rollout)
        return owner.maps_step_output(maps, steps, num_dimensions=0 if rollout else 1)


class ValueZeroingAttribution(ContextMixingAttribution):
    """Value Zeroing (Mohebbi et al., EACL 2023), computed in closed form from one forward pass.

    Zeroing the value vectors of token ``j`` in a layer changes each query's attention output by exactly
    ``-Σ_h α^h_ij v^h_j W^h_O``; the rest of the block is position-wise, so every zeroing of a layer is one batched
    pass through the rest of that block. Scores are the cosine (or Euclidean) distance between corrupted and clean
    layer outputs, rows normalised to sum to 1, with no clipping threshold.

    Outputs: per-layer scores (last dimension: layer). Encoder–decoders: source = cross-attention zeroing,
    target = decoder self-attention zeroing (with ``attribute_target=True``, else in
    ``sequence_scores["decoder_self_scores"]``),
    encoder self-attention zeroing in ``sequence_scores["encoder_self_scores"]``. Decoder-only: target scores.
    With ``rollout=True``, one rolled-out map instead of per-layer scores.

    This class replaces Inseq's built-in ``value_zeroing``, which ``import inseq_mixing`` renames to
    ``inseq_value_zeroing``.
    """

    method_name = "value_zeroing"
    method_call = _ValueZeroing
