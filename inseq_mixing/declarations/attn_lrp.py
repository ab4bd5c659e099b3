"""``attn_lrp``: AttnLRP (Achtibat et al., ICML 2024); math in :mod:`inseq_mixing.methods.attn_lrp`. A chunk's items
are copies of a sentence, one per explained position. It runs its own forward and backward passes through the model
(the rules are gradient modifications), so it reads the request's ids, not the recorded trace."""

from dataclasses import dataclass

from ..methods.attn_lrp import attn_lrp
from ..methods.results import LogitScores
from .base import Chunking, Contrast, Declaration, Request


@dataclass(frozen=True)
class AttnLrpOptions(Contrast, Chunking):
    pass


def compute(request: Request, options: AttnLrpOptions) -> LogitScores:
    scores = attn_lrp(
        request.model, request.spec, request.input_ids, request.attention_mask, request.target_ids,
        request.target_mask, request.predicted_ids, request.foil_ids, request.positions, options.max_chunk_elements,
    )  # fmt: skip
    return LogitScores(scores.target, scores.source, scores.logit, {"unattributed_absorbed": scores.absorbed},
                       scores.logit_after_softcap)  # fmt: skip


DECLARATION = Declaration(
    name="attn_lrp",
    summary="AttnLRP (Achtibat et al., ICML 2024): relevance propagation with attention-aware rules, one backward "
    "pass.",
    description=(
        "The logit's relevance is passed down with the ε-rule (ε → 0) through linear maps, the identity rule "
        "through activations and the normalisation of layer norms, the uniform rule (half to each factor) through "
        "the products q·kᵀ, A·V and gated FFNs, and the softmax rule; a token's relevance is read at its first-block "
        "input (embedding and position). Encoder–decoders are our extension of the paper.\n\n"
        "Outputs (signed): source and target relevances; each sequence's step_scores holds logit (or "
        "contrast_logits_diff) and unattributed_absorbed, the relevance that reaches no token (biases, norm shifts, "
        "the softmax rule's term): source + target relevances + unattributed_absorbed = the logit, for every "
        "generated token."
    ),
    options=AttnLrpOptions,
    compute=compute,
    explains_logit=True,
)
