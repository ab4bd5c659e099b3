"""``attention_rollout``: attention rollout (Abnar & Zuidema, ACL 2020); math in
:mod:`inseq_mixing.methods.norm_based`."""

from dataclasses import dataclass

from .base import Declaration, EncoderMaps, Request


@dataclass(frozen=True)
class AttentionRolloutOptions(EncoderMaps):
    pass


def compute(request: Request, options: AttentionRolloutOptions):
    from ..methods.norm_based import attention_rollout

    maps = attention_rollout(request.trace, request.first_explained_row())
    if not options.output_encoder_self_scores:
        maps.encoder = None
    return maps


DECLARATION = Declaration(
    name="attention_rollout",
    rows_sum_to_one=True,
    rank=5,
    summary="Attention rollout (Abnar & Zuidema, ACL 2020): head-averaged attention plus the identity, rolled out.",
    description=(
        "Each layer's map is 0.5 · mean_h(A) + 0.5 · I, rows renormalised; the maps are multiplied through the "
        "layers. Encoder–decoders (our extension): cross-attention gets the residual as a last column and the maps "
        "are rolled out with ALTI+'s joint bookkeeping, so source and target columns sum to 1 together. Learned "
        "attention sinks (GPT-OSS, our extension): rows are not renormalised, and each row's rest, the share that "
        "went to the sinks, is in sequence_scores['sink_share'] (a span's: step_scores['sink_share']). Works "
        "whatever attention implementation the model was loaded with (the pass is traced with eager attention)."
    ),
    options=AttentionRolloutOptions,
    compute=compute,
)
