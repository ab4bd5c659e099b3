"""Inseq glue for AttnLRP (``attn_lrp``)."""

from ..methods.attn_lrp import DEFAULT_CHUNK_ELEMENTS, attn_lrp
from .base import ContextMixingAttribution, MethodCall, MixingStepOutput, read_step_inputs


class _AttnLrp(MethodCall):
    def attribute(
        self,
        inputs,
        additional_forward_args,
        contrast_targets: str | list[str] | None = None,
        contrast_targets_alignments: list | None = None,
        max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ) -> MixingStepOutput:
        """Signed AttnLRP relevances of source and target tokens for each generated token's logit.

        Args:
            contrast_targets: A contrastive target text: explain ``logit(target) − logit(foil)``. Also read from the
                arguments of Inseq's ``attributed_fn="contrast_logits_diff"``.
            contrast_targets_alignments: ``(target index, contrast index)`` pairs, as in Inseq; default 1:1.
            max_chunk_elements: Bound on the activations of one chunk of explained positions (each explained in its
                own copy of the sentence; copies × layers × tokens × (tokens · heads + 8 · d_model)); at least one
                position per chunk.
        """
        owner = self.owner
        steps = read_step_inputs(inputs, additional_forward_args, owner.spec.is_encoder_decoder)
        foils = owner.contrast_ids(steps, contrast_targets, contrast_targets_alignments)
        positions = owner.explained_positions(steps)
        scores = attn_lrp(
            owner.attribution_model.model,
            owner.spec,
            steps.input_ids,
            steps.attention_mask,
            steps.target_ids,
            steps.target_mask,
            steps.predicted_ids,
            foils,
            positions,
            max_chunk_elements,
        )
        absorbed = {"absorbed": scores.absorbed}
        return owner.logit_step_output(steps, steps.decoder_mask, scores, foils is not None, absorbed)


class AttnLrpAttribution(ContextMixingAttribution):
    """AttnLRP (Achtibat et al., ICML 2024): relevance propagation with attention-aware rules, one backward pass.

    The logit's relevance is passed down with the ε-rule (ε → 0) through linear maps, the identity rule through
    activations and the normalisation of layer norms, the uniform rule (half to each factor) through the products
    ``q·kᵀ``, ``A·V`` and gated FFNs, and the softmax rule; a token's relevance is read at its first-block input
    (embedding and position). Encoder–decoders are our extension of the paper.

    Outputs (signed): source and target relevances; each sequence's ``step_scores`` holds ``logit`` (or
    ``contrast_logits_diff``) and ``absorbed``, the relevance that reaches no token (biases, norm shifts, the softmax
    rule's term): source + target relevances + ``absorbed`` = the logit, for every generated token.
    """

    method_name = "attn_lrp"
    method_call = _AttnLrp
    explains_logit = True
