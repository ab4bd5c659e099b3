"""``alti``: ALTI (Ferrando et al., EMNLP 2022) and, for encoder–decoders, ALTI+ (the NMT paper), rolled out or per
layer, or per head (our extension); math in :mod:`inseq_mixing.methods.alti`. A chunk's items are query positions."""

from dataclasses import dataclass, replace

from ..methods.options import CONVENTIONS
from .base import (
    Chunking,
    Compiling,
    Declaration,
    EncoderMaps,
    Heads,
    Layers,
    Request,
    head_axis_maps,
    layer_axis,
    option,
    self_and_cross_axis,
)


@dataclass(frozen=True)
class AltiOptions(Layers, EncoderMaps, Chunking, Compiling, Heads):
    """The default rolls the layer maps out through the model (ALTI+'s joint rollout for encoder–decoders);
    ``per_layer=True``: each layer's map; ``per_head=True`` implies per-layer maps."""

    convention: str = option(
        "paper",
        "'paper' (the paper's proximity, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁, a post-LN norm frozen with its eps) or "
        "'reference' (the authors' released code, mt-upc/transformer-contributions: distances from PyTorch's "
        "pairwise_distance, ‖T_i(x_j) − y_i + 1e-6‖₁, and a post-LN norm scaled by 1/σ without its eps; maps "
        "differ by up to about 1e-5 on a trained BERT, see scripts/compare_with_authors.py).",
        CONVENTIONS,
    )


def compute(request: Request, options: AltiOptions):
    from ..methods.alti import alti, alti_maps, alti_rollout

    trace, encoder = request.trace, options.output_encoder_self_scores
    convention = options.convention
    if options.per_head:
        maps = alti_maps(alti(trace, encoder, options.max_chunk_elements, per_head=True, convention=convention), False)
        layers, slots = maps.target.shape[1:3]
        maps = replace(maps, **head_axis_maps(maps.target, None, maps.source, encoder=maps.encoder))
        maps.axis = self_and_cross_axis(request.spec, layers, slots - 1, residual=True)
    elif not options.per_layer and not request.spec.is_encoder_decoder:  # one layer's map at a time, the rows read
        maps = alti_rollout(trace, request.first_explained_row(), options.max_chunk_elements, convention)
    else:
        rollout = not options.per_layer
        scores = alti(trace, rollout or encoder, options.max_chunk_elements, convention=convention)
        maps = alti_maps(scores, rollout)
        maps.axis = None if rollout else layer_axis(maps.target.shape[1])
    if not encoder:
        maps.encoder = None
    return maps


DECLARATION = Declaration(
    name="alti",
    rows_sum_to_one=True,
    rank=1,
    summary="ALTI (Ferrando et al., EMNLP 2022) and, for encoder–decoders, ALTI+ (Ferrando et al., EMNLP 2022, NMT).",
    description=(
        "Each attention sub-block's output is split into one vector per context token (the residual counted as the "
        "token's own part); a token's contribution is max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁), rows normalised to 1. "
        "Post-LN blocks apply their norm, frozen at the forward pass, to every part.\n\n"
        "Outputs: by default the rollout through all layers: for encoder–decoders the ALTI+ joint rollout, whose "
        "source and target columns sum to 1 together for each generated token; encoder rollout in "
        "sequence_scores['encoder_self_scores']. With per_layer=True, per-layer maps (last dimension: layer; for "
        "encoder–decoders the joint ALTI+ layer blocks). With per_head=True (our extension), per-layer maps split by "
        "attention head, the residual stream in a slot of its own: the last dimension indexes (layer, slot) as "
        "layer · (H + 1) + slot (encoder–decoders: self-attention slots, then cross-attention slots), labelled in "
        "the output's info['score_axis']; each generated token's scores of one layer sum to 1."
    ),
    options=AltiOptions,
    compute=compute,
    reads_rows=True,
    reads_mixers=True,
)
