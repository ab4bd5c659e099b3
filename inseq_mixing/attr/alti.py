"""Inseq glue for ALTI / ALTI+ (``alti``) and ALTI-logit (``alti_logit``)."""

from dataclasses import replace

import torch

from ..methods.alti import DEFAULT_CHUNK_ELEMENTS, alti, alti_maps
from ..methods.alti_logit import alti_logit
from .base import ContextMixingAttribution, MethodCall, MixingStepOutput, read_step_inputs


class _Alti(MethodCall):
    def attribute(
        self,
        inputs,
        additional_forward_args,
        rollout: bool = True,
        output_encoder_self_scores: bool = True,
        max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
        per_head: bool = False,
    ) -> MixingStepOutput:
        """Relevance of source and target-prefix tokens for every generated token, rolled out (or per layer).

        Args:
            rollout: Roll the layer maps out through the model (ALTI+'s joint rollout for encoder–decoders). With
                False, return each layer's map (last dimension: layer).
            output_encoder_self_scores: Return the encoder map in ``sequence_scores["encoder_self_scores"]``.
            max_chunk_elements: Elements of one chunk of per-(position, token) parts (batch × positions × tokens ×
                d_model); at least one position per chunk.
            per_head: Per-layer maps split by attention head (our extension; no rollout): a last dimension indexes
                (layer, slot) as ``layer · (H + 1) + slot``, slot ``H`` being the residual stream; encoder–decoders:
                self-attention slots first, then ``L · (H + 1)`` cross-attention slots. Each generated token's
                scores of one layer (every slot, source and target) sum to 1.
        """
        owner = self.owner
        steps = read_step_inputs(inputs, additional_forward_args, owner.spec.is_encoder_decoder)
        trace = owner.trace(steps)
        if per_head:
            maps = alti_maps(alti(trace, output_encoder_self_scores, max_chunk_elements, per_head=True), False)
            maps = head_axis_maps(maps, maps.target, None, maps.source, encoder=maps.encoder)
            rollout = False
        else:
            maps = self.maps(trace, rollout, output_encoder_self_scores, max_chunk_elements)
        if not output_encoder_self_scores:
            maps.encoder = None
        return owner.maps_step_output(maps, steps, num_dimensions=0 if rollout else 1)

    @staticmethod
    def maps(trace, rollout: bool, encoder: bool, max_chunk_elements: int):
        """The method's maps (``target``, ``source``, ``encoder``) from a trace."""
        return alti_maps(alti(trace, rollout or encoder, max_chunk_elements), rollout)


class AltiAttribution(ContextMixingAttribution):
    """ALTI (Ferrando et al., EMNLP 2022) and, for encoder–decoders, ALTI+ (Ferrando et al., EMNLP 2022, NMT).

    Each attention sub-block's output is split into one vector per context token (the residual counted as the token's
    own part); a token's contribution is ``max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``, rows normalised to 1. Post-LN blocks
    apply their norm, frozen at the forward pass, to every part.

    Outputs: by default the rollout through all layers: for encoder–decoders the ALTI+ joint rollout, whose source and
    target columns sum to 1 together for each generated token; encoder rollout in
    ``sequence_scores["encoder_self_scores"]``. With ``rollout=False``, per-layer maps (last dimension: layer; for
    encoder–decoders the joint ALTI+ layer blocks). With ``per_head=True`` (our extension), per-layer maps split by
    attention head, the residual stream in a slot of its own.
    """

    method_name = "alti"
    method_call = _Alti


class _AltiLogit(MethodCall):
    def attribute(
        self,
        inputs,
        additional_forward_args,
        contrast_targets: str | list[str] | None = None,
        contrast_targets_alignments: list | None = None,
        max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
        per_head: bool = False,
    ) -> MixingStepOutput:
        """Signed ALTI-logit contributions of source and target tokens to each generated token's logit.

        Args:
            contrast_targets: A contrastive target text: explain ``logit(target) − logit(foil)``, the foil being the
                aligned token of this text at each step. Also read from the arguments of Inseq's
                ``attributed_fn="contrast_logits_diff"``.
            contrast_targets_alignments: ``(target index, contrast index)`` pairs, as in Inseq; default 1:1.
            max_chunk_elements: Elements of one chunk of per-(position, token) ALTI parts (batch × positions ×
                tokens × d_model); at least one position per chunk.
            per_head: Split the scores by attention head: a last dimension indexes (layer, head) as
                ``layer · H + head`` (encoder–decoders: self-attention heads first, then ``L · H`` cross-attention
                heads); the embedding's direct term goes to the step score ``direct_embedding``.
        """
        owner = self.owner
        steps = read_step_inputs(inputs, additional_forward_args, owner.spec.is_encoder_decoder)
        trace = owner.trace(steps)
        foils = owner.contrast_ids(steps, contrast_targets, contrast_targets_alignments)
        scores = alti_logit(
            trace, steps.predicted_ids, foils, max_chunk_elements=max_chunk_elements, per_head=per_head
        )
        step_scores = {f"unattributed_{name}": term for name, term in scores.unattributed.items()}
        if not per_head:
            return owner.logit_step_output(steps, trace.decoder.mask, scores, foils is not None, step_scores)
        step_scores["direct_embedding"] = scores.direct
        return owner.logit_step_output(
            steps, trace.decoder.mask, logit_head_maps(scores), foils is not None, step_scores, 1
        )


def logit_head_maps(scores):
    """A logit method's ``target_heads`` ``(B, L, H, T, T)`` and ``source_heads`` ``(B, 2, L, H, T, S)`` (through
    self- and cross-attention heads) as maps with one (layer, head) axis (see :func:`head_axis_maps`)."""
    sources = [None] if scores.source_heads is None else scores.source_heads.unbind(1)
    return head_axis_maps(scores, scores.target_heads, *sources)


def head_axis_maps(scores, target: torch.Tensor, self_source=None, cross_source=None, encoder=None):
    """Per-head maps ``(B, L, H, T, ·)`` laid out with one axis ``(B, slots, T, ·)``, layer-major; encoder–decoders:
    the self-attention heads' slots, then the cross-attention heads' (which carry no target token). ``scores`` gets
    the new ``target``, ``source`` (and ``encoder``, ``(B, L, H, S, S)``) fields."""
    target = target.flatten(1, 2)
    fields = {"target": target}
    if cross_source is not None:
        self_source = torch.zeros_like(cross_source) if self_source is None else self_source
        fields["source"] = torch.cat([self_source.flatten(1, 2), cross_source.flatten(1, 2)], dim=1)
        fields["target"] = torch.cat([target, torch.zeros_like(target)], dim=1)
    if encoder is not None:
        fields["encoder"] = encoder.flatten(1, 2)
    return replace(scores, **fields)


class AltiLogitAttribution(ContextMixingAttribution):
    """ALTI-logit (Ferrando et al., ACL 2023): signed contributions of input tokens to each generated token's logit.

    Every attention sub-block's part for a context token, projected on the unembedding row of the generated token
    (through the final norm and, in post-LN models, every later norm, all frozen at the forward pass), is traced back
    to the input tokens with the ALTI rollout of the layers below. Encoder–decoders use the ALTI+ rollouts: this is
    our extension of the paper, which covers decoder-only models.

    Outputs (not normalised: show them with ``normalize=False`` kept, as the default aggregation does): signed source
    and target scores; each sequence's ``step_scores`` holds ``logit`` (or ``contrast_logits_diff``) and the terms not
    attributed to tokens, ``unattributed_ffn``, ``unattributed_attention_bias``, ``unattributed_norm_bias`` and
    ``unattributed_logit_bias``. For every generated token, source scores + target scores + the four unattributed
    terms = the logit. With ``per_head=True``, a last dimension splits the token scores by (layer, attention head),
    the embedding's direct term moving to the step score ``direct_embedding``.
    """

    method_name = "alti_logit"
    method_call = _AltiLogit
    explains_logit = True
