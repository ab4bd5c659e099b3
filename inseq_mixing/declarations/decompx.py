"""``decompx``: DecompX (Modarressi et al., ACL 2023); math in :mod:`inseq_mixing.methods.decompx`, whose
:class:`~inseq_mixing.methods.decompx.DecompXOptions` declares the decomposition's own options. A chunk's items are
positions or components (see ``DecompXOptions``)."""

from dataclasses import dataclass

from ..methods.options import DecompXOptions
from ..methods.results import LogitScores
from .base import Contrast, Declaration, Heads, Request, logit_scores, option


@dataclass(frozen=True)
class DecompXMethodOptions(DecompXOptions, Contrast, Heads):
    unit_components: bool = option(
        False,
        "Speech models, and a decoder-only model's context units (units= of model.attribute with spans): decompose "
        "over the units from the first block (one component per unit) instead of over frames or tokens summed per "
        "unit afterwards: frames (tokens) / units times less work and memory. Equal with bias='separate'; with the "
        "other splits a unit's component takes its bias shares as a whole (our extension).",
    )


def compute(request: Request, options: DecompXMethodOptions) -> LogitScores:
    from ..methods.decompx import decompx

    units = request.units if options.unit_components else None
    scores = decompx(request.trace, request.predicted_ids, request.foil_ids, options, per_head=options.per_head,
                     units=units, positions=request.positions)  # fmt: skip
    terms = {} if scores.bias is None else {"unattributed_bias": scores.bias}
    result = logit_scores(scores, terms, request.spec, options.per_head)
    result.complete = not options.per_head  # heads' direct contributions only: no FFN, residual or bias paths
    if request.units is not None and units is None:  # frames, summed per unit
        result = request.units.pool(result)
    return result


DECLARATION = Declaration(
    name="decompx",
    rank=4,
    class_stem="DecompX",
    summary="DecompX (Modarressi et al., ACL 2023): signed, exact contributions of each input token to a generated "
    "token's logit, propagating a per-token decomposition of the hidden states through every layer, FFNs included.",
    description=(
        "Each hidden state is a sum of one component per input token; attention, norms (frozen statistics), FFNs "
        "(the activation linearised at the true pre-activation) and biases (split over components) are applied to "
        "every component, and the final state is projected on the unembedding row. Encoder–decoders decompose the "
        "encoder over source tokens and the decoder over [source | target]: the encoder–decoder and decoder-only "
        "versions are our extension of the paper, which explains encoder classifiers. On encoder-only models "
        "(inseq_mixing.load_model) the components go through the classifier or masked-LM head, frozen at the forward "
        "pass, each bias split on the way, as the paper does for BERT's pooler (masked-LM heads: our extension).\n\n"
        "Outputs: signed source and target scores; each sequence's step_scores holds logit (or "
        "contrast_logits_diff) and, with bias='separate', unattributed_bias. Source + target scores "
        "(+ unattributed_bias) = the logit, for every generated token. With per_head=True (our extension), each "
        "decoder attention head's direct contribution, by token, on a last (layer, head) axis laid out as "
        "layer · H + head (labelled in info['score_axis']): summed over tokens, a head's scores plus its value-bias "
        "term equal ALTI-logit's per-head part; these are not a decomposition of the logit (no FFN, residual or "
        "bias paths), so they do not add up to it."
    ),
    options=DecompXMethodOptions,
    compute=compute,
    explains_logit=True,
    pools_units=True,
    reads_mixers=True,
)
