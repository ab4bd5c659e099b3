"""Inseq glue for Value Zeroing: registered as ``value_zeroing``, replacing Inseq's built-in (renamed)."""

from ..methods.value_zeroing import DEFAULT_CHUNK_ELEMENTS, value_zeroing, value_zeroing_maps
from .base import ContextMixingAttribution, MixingStepOutput, inseq_layout, read_step_inputs


class _ValueZeroing:
    """Callable holder whose ``attribute`` signature lists the options users pass to ``model.attribute``."""

    def __init__(self, owner: "ValueZeroingAttribution"):
        self.owner = owner

    @staticmethod
    def has_convergence_delta() -> bool:
        return False

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
            inputs: Inseq's attributed inputs (their number tells whether target attribution was asked).
            additional_forward_args: Inseq's extra arguments (token ids and masks).
            similarity_metric: ``"cosine"`` (cosine distance, the paper's) or ``"euclidean"``.
            normalization: ``"separate"`` (each map's rows sum to 1, as in the paper) or ``"joint"``
                (encoder–decoders: source and target rows of a layer sum to 1 together).
            rollout: Return the rollout across layers instead of per-layer scores (encoder–decoders: ALTI+-style
                joint rollout, our extension).
            output_encoder_self_scores: Compute the encoder self-attention scores (encoder–decoders).
            max_chunk_elements: Memory bound of one chunk of corrupted states.
        """
        owner = self.owner
        is_enc_dec = owner.spec.is_encoder_decoder
        steps = read_step_inputs(inputs, additional_forward_args, is_enc_dec)
        trace = owner.trace(steps)
        scores = value_zeroing(trace, similarity_metric, output_encoder_self_scores or rollout, max_chunk_elements)
        maps = value_zeroing_maps(scores, normalization, rollout)
        num_dimensions = 0 if rollout else 1
        target = inseq_layout(maps.target, causal=True)
        if not is_enc_dec:
            return MixingStepOutput(target_attributions=target, _num_dimensions=num_dimensions)
        sequence_scores = {}
        if maps.encoder is not None:
            sequence_scores["encoder_self_scores"] = inseq_layout(maps.encoder, causal=False)
        if not steps.attribute_target:
            sequence_scores["decoder_self_scores"] = target
        return MixingStepOutput(
            source_attributions=inseq_layout(maps.source, causal=False),
            target_attributions=target if steps.attribute_target else None,
            sequence_scores=sequence_scores,
            _num_dimensions=num_dimensions,
        )


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

    def __init__(self, attribution_model, **kwargs):
        super().__init__(attribution_model, **kwargs)
        self.method = _ValueZeroing(self)
