"""``attn_lrp``: AttnLRP (Achtibat et al., ICML 2024); math in :mod:`inseq_mixing.methods.attn_lrp`. A chunk's items
are copies of a sentence, one per explained position. Its rules are gradient modifications, so it runs forward and
backward passes of its own: those of the traced call (the trace's model and arguments)."""

from dataclasses import dataclass

from ..methods.results import LogitScores
from .base import Chunking, Contrast, Declaration, Request


@dataclass(frozen=True)
class AttnLrpOptions(Contrast, Chunking):
    pass


def compute(request: Request, options: AttnLrpOptions) -> LogitScores:
    from ..methods.attn_lrp import attn_lrp_of_trace, lrp_of_call

    explained = (request.predicted_ids, request.foil_ids, request.positions, options.max_chunk_elements)
    if request.spec.head is None:  # its own passes are all it runs: no trace recorded beside them
        scores = lrp_of_call(request.spec, request.model_call(), *explained)
    else:  # an encoder's head is frozen at the traced forward pass
        scores = attn_lrp_of_trace(request.trace, *explained)
    return LogitScores(scores.target, scores.source, scores.logit, {"unattributed_absorbed": scores.absorbed},
                       scores.logit_after_softcap)  # fmt: skip


def compute_span(request: Request, options: AttnLrpOptions, spans) -> LogitScores:
    """One backward pass per span from its summed logit (:func:`~inseq_mixing.methods.attn_lrp.span_lrp_of_call`)."""
    import torch

    from ..methods.attn_lrp import span_lrp_of_call

    call = request.model_call()
    parts = [
        span_lrp_of_call(
            request.spec, call, request.predicted_ids, request.foil_ids, members > 0, options.max_chunk_elements
        )  # fmt: skip
        for members in spans.members.unbind(1)
    ]
    source = None if parts[0].source is None else torch.stack([part.source for part in parts], 1)
    return LogitScores(torch.stack([part.target for part in parts], 1), source,
                       torch.stack([part.logit for part in parts], 1),
                       {"unattributed_absorbed": torch.stack([part.absorbed for part in parts], 1)})  # fmt: skip


DECLARATION = Declaration(
    name="attn_lrp",
    rank=3,
    summary="AttnLRP (Achtibat et al., ICML 2024): relevance propagation with attention-aware rules, one backward "
    "pass.",
    description=(
        "The logit's relevance is passed down with the ε-rule (ε → 0) through linear maps, the identity rule "
        "through activations and the normalisation of layer norms, the uniform rule (half to each factor) through "
        "the products q·kᵀ, A·V and gated FFNs, and the softmax rule; a token's relevance is read at its first-block "
        "input (embedding and position). Encoder–decoders are our extension of the paper. "
        "On encoder-only models (inseq_mixing.load_model) the relevance starts at the final hidden state along "
        "the head frozen at the forward pass (the identity rule on its activations and norms; our extension).\n\n"
        "Outputs (signed): source and target relevances; each sequence's step_scores holds logit (or "
        "contrast_logits_diff) and unattributed_absorbed, the relevance that reaches no token (biases, norm shifts, "
        "the softmax rule's term): source + target relevances + unattributed_absorbed = the logit, for every "
        "generated token."
    ),
    options=AttnLrpOptions,
    compute=compute,
    compute_span=compute_span,
    explains_logit=True,
    reads_mixers=True,
)
