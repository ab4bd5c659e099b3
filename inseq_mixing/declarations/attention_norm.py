"""``attention_norm``: the attention norm (Kobayashi et al., EMNLP 2020) and its residual and layer-norm extensions
(EMNLP 2021); math in :mod:`inseq_mixing.methods.norm_based`. A chunk's items are query positions."""

from dataclasses import dataclass

from .base import Chunking, Declaration, EncoderMaps, Layers, Request, layer_axis, option


@dataclass(frozen=True)
class AttentionNormOptions(Layers, EncoderMaps, Chunking):
    residual: bool = option(False, "Add the residual to each token's own vector (Kobayashi et al., 2021, 'N-Res').")
    layer_norm: bool = option(
        False, "Also pass every vector through the block's frozen layer norm ('N-ResLN'; implies the residual)."
    )


def compute(request: Request, options: AttentionNormOptions):
    from ..methods.norm_based import attention_norm

    maps = attention_norm(
        request.trace, options.residual, options.layer_norm, options.output_encoder_self_scores,
        options.max_chunk_elements, options.per_layer, request.first_explained_row(),
        ratios_from_first_row=request.explained_rows_only,
    )  # fmt: skip
    maps.positions = {name: value.permute(0, 2, 1) for name, value in maps.positions.items()}  # (B, T, L)
    if options.per_layer:
        maps.axis = layer_axis(maps.target.shape[1])
    return maps


DECLARATION = Declaration(
    name="attention_norm",
    rank=6,
    summary="Attention norm (Kobayashi et al., EMNLP 2020): ‖Σ_h α^h_ij f^h(x_j)‖ per layer, with the residual "
    "('N-Res') and layer-norm ('N-ResLN') extensions of Kobayashi et al. (EMNLP 2021) as options.",
    description=(
        "Outputs: one map, the mean of the layers' maps (our choice of one map: the papers read each layer's), not "
        "normalised; per_layer=True: each layer's map (last dimension: layer). The decoder's context-mixing ratio per "
        "position and layer in sequence_scores['context_mixing_ratio'] (T, L). Pre-LN blocks with layer_norm use the "
        "norm that next reads the residual stream (our extension); encoder–decoders and decoders are our extension "
        "too."
    ),
    options=AttentionNormOptions,
    compute=compute,
    paper_layout={"per_layer": True},
    reads_rows=True,
    reads_mixers=True,
)
