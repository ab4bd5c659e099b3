"""``alti_logit``: ALTI-logit (Ferrando et al., ACL 2023); math in :mod:`inseq_mixing.methods.alti_logit`. A chunk's
items are query positions."""

from dataclasses import dataclass

from ..methods.results import LogitScores
from .base import Chunking, Compiling, Contrast, Declaration, Heads, Request, logit_scores


@dataclass(frozen=True)
class AltiLogitOptions(Contrast, Chunking, Compiling, Heads):
    pass


def compute(request: Request, options: AltiLogitOptions) -> LogitScores:
    from ..methods.alti_logit import alti_logit

    scores = alti_logit(
        request.trace, request.predicted_ids, request.foil_ids, max_chunk_elements=options.max_chunk_elements,
        per_head=options.per_head, first_row=request.first_explained_row(),
    )  # fmt: skip
    terms = {f"unattributed_{name}": term for name, term in scores.unattributed.items()}
    if options.per_head:
        terms["unattributed_embedding"] = scores.direct
    return logit_scores(scores, terms, request.spec, options.per_head)


DECLARATION = Declaration(
    name="alti_logit",
    rank=2,
    summary="ALTI-logit (Ferrando et al., ACL 2023): signed contributions of input tokens to each generated token's "
    "logit.",
    description=(
        "Every attention sub-block's part for a context token, projected on the unembedding row of the generated "
        "token (through the final norm and, in post-LN models, every later norm, all frozen at the forward pass), is "
        "traced back to the input tokens with the ALTI rollout of the layers below. Encoder–decoders use the ALTI+ "
        "rollouts: this is our extension of the paper, which covers decoder-only models. "
        "On encoder-only models (inseq_mixing.load_model) the masked-LM or classifier head is frozen at the "
        "forward pass (activation slopes f(z)/z, norm statistics), so the logit is affine in the final hidden "
        "state: our extension, as are encoders themselves.\n\n"
        "Outputs (not normalised: show them with normalize=False kept, as the default aggregation does): signed "
        "source and target scores; each sequence's step_scores holds logit (or contrast_logits_diff) and the terms "
        "not attributed to tokens, unattributed_ffn, unattributed_attention_bias, unattributed_norm_bias and "
        "unattributed_logit_bias. For every generated token, source scores + target scores + the four unattributed "
        "terms = the logit. With per_head=True, a last dimension splits the token scores by (layer, attention head) "
        "as layer · H + head (encoder–decoders: self-attention heads, then cross-attention heads; labelled in "
        "info['score_axis']), the embedding's direct term (given to no head) moving to the step score "
        "unattributed_embedding."
    ),
    options=AltiLogitOptions,
    compute=compute,
    explains_logit=True,
    reads_rows=True,
    reads_mixers=True,
)
