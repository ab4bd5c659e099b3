"""Inseq glue for DecompX (``decompx``)."""

from ..methods.decompx import (
    BIAS_SPLITS,
    CONVENTIONS,
    DEFAULT_CHUNK_ELEMENTS,
    FFN_LINEARIZATIONS,
    GATED_SPLITS,
    DecompXOptions,
    decompx,
)
from .alti import logit_head_maps
from .base import ContextMixingAttribution, MethodCall, MixingStepOutput, read_step_inputs


class _DecompX(MethodCall):
    choices = {
        "bias": BIAS_SPLITS,
        "ffn_linearization": FFN_LINEARIZATIONS,
        "gated_split": GATED_SPLITS,
        "convention": CONVENTIONS,
    }

    def attribute(
        self,
        inputs,
        additional_forward_args,
        bias: str = "absdot",
        ffn_linearization: str = "zero_origin",
        gated_split: str = "linear",
        include_ffn: bool = True,
        contrast_targets: str | list[str] | None = None,
        contrast_targets_alignments: list | None = None,
        max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
        convention: str = "paper",
        per_head: bool = False,
    ) -> MixingStepOutput:
        """Signed DecompX contributions of source and target tokens to each generated token's logit.

        Args:
            bias: How biases are split over token components: ``"absdot"`` (by ``|component · bias|``, the paper's
                default), ``"norm"`` (by component norm), ``"equal"``, or ``"separate"`` (kept in one bias component,
                returned in ``step_scores["bias_component"]``).
            ffn_linearization: ``"zero_origin"`` (slope ``f(z)/z`` at the true pre-activation, exact) or
                ``"tangent"`` (slope ``f'(z)``; the intercept is split like a bias).
            gated_split: Gated FFNs (SwiGLU, gated-GELU): decompose the ``"linear"`` branch with the gate held at its
                true value, or the ``"gate"`` branch with the linear branch held.
            include_ffn: Decompose through the FFNs; with False their outputs are split like biases.
            contrast_targets: A contrastive target text: explain ``logit(target) − logit(foil)``. Also read from the
                arguments of Inseq's ``attributed_fn="contrast_logits_diff"``.
            contrast_targets_alignments: ``(target index, contrast index)`` pairs, as in Inseq; default 1:1.
            max_chunk_elements: Elements of the largest temporary tensor of one chunk: a block of the stored stream
                (positions × components × d_model), an attention slab (positions × components × d_model) or FFN
                activations (positions × components × d_ff); at least one position or component per chunk. The
                decomposed stream itself holds about n²/2 × d_model elements for n causal positions.
            convention: ``"paper"`` (the paper's text) or ``"reference"`` (the authors' released code: the attention
                bias split over residual plus attention output, the logit bias by each component's whole logit
                vector); see :class:`~inseq_mixing.methods.decompx.DecompXOptions`.
            per_head: Return each decoder attention head's direct contribution instead (our extension): its output
                components read out along the logit direction on its branch, a last dimension indexing (layer, head)
                as ``layer · H + head`` (encoder–decoders: self-attention heads, then cross-attention heads). Summed
                over tokens, a head's scores plus its value-bias term equal ALTI-logit's per-head part.
        """
        owner = self.owner
        options = DecompXOptions(bias, ffn_linearization, gated_split, include_ffn, max_chunk_elements, convention)
        steps = read_step_inputs(inputs, additional_forward_args, owner.spec.is_encoder_decoder)
        trace = owner.trace(steps)
        foils = owner.contrast_ids(steps, contrast_targets, contrast_targets_alignments)
        scores = decompx(trace, steps.predicted_ids, foils, options, per_head=per_head)
        step_scores = {} if scores.bias is None else {"bias_component": scores.bias}
        if not per_head:
            return owner.logit_step_output(steps, trace.decoder.mask, scores, foils is not None, step_scores)
        maps = logit_head_maps(scores)
        return owner.logit_step_output(steps, trace.decoder.mask, maps, foils is not None, step_scores, 1)


class DecompXAttribution(ContextMixingAttribution):
    """DecompX (Modarressi et al., ACL 2023): signed, exact contributions of each input token to a generated token's
    logit, propagating a per-token decomposition of the hidden states through every layer, FFNs included.

    Each hidden state is a sum of one component per input token; attention, norms (frozen statistics), FFNs (the
    activation linearised at the true pre-activation) and biases (split over components) are applied to every
    component, and the final state is projected on the unembedding row. Encoder–decoders decompose the encoder over
    source tokens and the decoder over [source | target]: **the encoder–decoder and decoder-only versions are our
    extension of the paper**, which explains encoder classifiers.

    Outputs: signed source and target scores; each sequence's ``step_scores`` holds ``logit`` (or
    ``contrast_logits_diff``) and, with ``bias="separate"``, ``bias_component``. Source + target scores
    (+ ``bias_component``) = the logit, for every generated token. With ``per_head=True`` (our extension), each
    decoder attention head's direct contribution, by token, on a last (layer, head) axis.
    """

    method_name = "decompx"
    method_call = _DecompX
    explains_logit = True
