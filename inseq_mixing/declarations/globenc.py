"""``globenc``: GlobEnc (Modarressi et al., NAACL 2022); math in :mod:`inseq_mixing.methods.norm_based`. A chunk's
items are query positions."""

from dataclasses import dataclass

from .base import Chunking, Declaration, EncoderMaps, Layers, Request, layer_axis


@dataclass(frozen=True)
class GlobEncOptions(Layers, EncoderMaps, Chunking):
    """The default rolls the layer maps out (ALTI+'s joint rollout for encoder–decoders); ``per_layer=True``: each
    layer's map, rows normalised, not rolled out."""


def compute(request: Request, options: GlobEncOptions):
    from ..methods.norm_based import globenc

    rollout = not options.per_layer
    first_row = request.first_explained_row() if rollout else 0  # the rolled-out rows read
    maps = globenc(request.trace, rollout, options.max_chunk_elements, first_row)
    if not options.output_encoder_self_scores:
        maps.encoder = None
    maps.axis = None if rollout else layer_axis(maps.target.shape[1])
    return maps


DECLARATION = Declaration(
    name="globenc",
    rows_sum_to_one=True,
    rank=7,
    class_stem="GlobEnc",
    summary="GlobEnc (Modarressi et al., NAACL 2022): norms of each token's vector through the attention, both "
    "residuals and both layer norms of a layer (FFN excluded), rows normalised, rolled out.",
    description=(
        "Outputs: the rollout through all layers; per_layer=True: each layer's map (last dimension: layer). "
        "Pre-LN blocks have no norm on the residual stream: their vectors are attention plus residual. Decoders and "
        "encoder–decoders (ALTI+'s joint rollout of self- and cross-attention maps) are our extension of the paper, "
        "which explains encoders. GlobEnc has no per-head form here: its norms are of whole-layer vectors "
        "(per_head is refused as an unknown option)."
    ),
    options=GlobEncOptions,
    compute=compute,
    reads_rows=True,
    reads_mixers=True,
)
