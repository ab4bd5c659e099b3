"""``attention_rollout``: attention rollout (Abnar & Zuidema, ACL 2020); math in
:mod:`inseq_mixing.methods.norm_based`."""

from dataclasses import dataclass

from .base import Declaration, EncoderMaps, Layers, Request, layer_axis


@dataclass(frozen=True)
class AttentionRolloutOptions(Layers, EncoderMaps):
    """The default multiplies the layer maps through the model; ``per_layer=True``: each layer's map."""


def compute(request: Request, options: AttentionRolloutOptions):
    from ..methods.norm_based import attention_rollout

    maps = attention_rollout(request.trace, request.first_explained_row(), options.per_layer)
    if not options.output_encoder_self_scores:
        maps.encoder = None
    if options.per_layer:
        maps.axis = layer_axis(maps.target.shape[1])
    return maps


DECLARATION = Declaration(
    name="attention_rollout",
    rows_sum_to_one=True,
    rank=5,
    summary="Attention rollout (Abnar & Zuidema, ACL 2020): head-averaged attention plus the identity, rolled out.",
    description=(
        "Each layer's map is 0.5 · mean_h(A) + 0.5 · I, rows renormalised; the maps are multiplied through the "
        "layers; per_layer=True: each layer's map before the product (last dimension: layer). Encoder–decoders (our "
        "extension): cross-attention gets the residual as a last column and the maps are rolled out with ALTI+'s "
        "joint bookkeeping, so source and target columns sum to 1 together. Learned attention sinks (GPT-OSS, our "
        "extension): rows are not renormalised, and each row's rest, the share that went to the sinks, is in "
        "sequence_scores['sink_share'] (a span's: step_scores['sink_share']; with per_layer=True, each layer's, (T, "
        "L)). Works whatever attention implementation the model was loaded with (the pass is traced with eager "
        "attention)."
    ),
    options=AttentionRolloutOptions,
    compute=compute,
    reads_rows=True,
    records="attention",
    reads_mixers=True,
)
