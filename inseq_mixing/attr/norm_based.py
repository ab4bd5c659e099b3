"""Inseq glue for attention rollout (``attention_rollout``), the attention-norm family (``attention_norm``) and
GlobEnc (``globenc``)."""

from ..methods.norm_based import attention_norm, attention_rollout, globenc
from ..methods.parts import DEFAULT_CHUNK_ELEMENTS
from .alti import _Alti
from .base import ContextMixingAttribution, MethodCall, MixingStepOutput, read_step_inputs


class _AttentionRollout(MethodCall):
    def attribute(self, inputs, additional_forward_args, output_encoder_self_scores: bool = True) -> MixingStepOutput:
        """Attention rollout of source and target-prefix tokens for every generated token.

        Args:
            output_encoder_self_scores: Return the encoder rollout in ``sequence_scores["encoder_self_scores"]``.
        """
        owner = self.owner
        steps = read_step_inputs(inputs, additional_forward_args, owner.spec.is_encoder_decoder)
        maps = attention_rollout(owner.trace(steps))
        if not output_encoder_self_scores:
            maps.encoder = None
        return owner.maps_step_output(maps, steps, num_dimensions=0)


class AttentionRolloutAttribution(ContextMixingAttribution):
    """Attention rollout (Abnar & Zuidema, ACL 2020): head-averaged attention plus the identity, rolled out.

    Each layer's map is ``0.5 · mean_h(A) + 0.5 · I``, rows renormalised; the maps are multiplied through the layers.
    Encoder–decoders (our extension): cross-attention gets the residual as a last column and the maps are rolled out
    with ALTI+'s joint bookkeeping, so source and target columns sum to 1 together. Works whatever attention
    implementation the model was loaded with (the pass is traced with eager attention).
    """

    method_name = "attention_rollout"
    method_call = _AttentionRollout


class _AttentionNorm(MethodCall):
    def attribute(
        self,
        inputs,
        additional_forward_args,
        residual: bool = False,
        layer_norm: bool = False,
        output_encoder_self_scores: bool = True,
        max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ) -> MixingStepOutput:
        """Per-layer norms of what each context token adds to each position (last dimension: layer).

        Args:
            residual: Add the residual to each token's own vector (Kobayashi et al., 2021, "N-Res").
            layer_norm: Also pass every vector through the block's frozen layer norm ("N-ResLN"; implies the
                residual).
            output_encoder_self_scores: Return the encoder maps in ``sequence_scores["encoder_self_scores"]``.
            max_chunk_elements: Elements of one chunk of per-(position, token) vectors.
        """
        owner = self.owner
        steps = read_step_inputs(inputs, additional_forward_args, owner.spec.is_encoder_decoder)
        trace = owner.trace(steps)
        maps = attention_norm(trace, residual, layer_norm, output_encoder_self_scores, max_chunk_elements)
        owner.keep_sequence_scores({"context_mixing_ratio": maps.ratio.permute(0, 2, 1)}, trace.decoder.mask)
        return owner.maps_step_output(maps, steps, num_dimensions=1)


class AttentionNormAttribution(ContextMixingAttribution):
    """Attention norm (Kobayashi et al., EMNLP 2020): ``‖Σ_h α^h_ij f^h(x_j)‖`` per layer, with the residual
    ("N-Res") and layer-norm ("N-ResLN") extensions of Kobayashi et al. (EMNLP 2021) as options.

    Outputs: per-layer maps (last dimension: layer), not normalised; the decoder's context-mixing ratio per position
    and layer in ``sequence_scores["context_mixing_ratio"]`` ``(T, L)``. Pre-LN blocks with ``layer_norm`` use the
    norm that next reads the residual stream (our extension); encoder–decoders and decoders are our extension too.
    """

    method_name = "attention_norm"
    method_call = _AttentionNorm


class _GlobEnc(_Alti):
    """GlobEnc's maps, with ALTI's options (``rollout``, ``output_encoder_self_scores``, ``max_chunk_elements``)."""

    @staticmethod
    def maps(trace, rollout: bool, encoder: bool, max_chunk_elements: int):
        return globenc(trace, rollout, max_chunk_elements)


class GlobEncAttribution(ContextMixingAttribution):
    """GlobEnc (Modarressi et al., NAACL 2022): norms of each token's vector through the attention, both residuals
    and both layer norms of a layer (FFN excluded), rows normalised, rolled out.

    Pre-LN blocks have no norm on the residual stream: their vectors are attention plus residual. Decoders and
    encoder–decoders (ALTI+'s joint rollout of self- and cross-attention maps) are our extension of the paper, which
    explains encoders.
    """

    method_name = "globenc"
    method_call = _GlobEnc
