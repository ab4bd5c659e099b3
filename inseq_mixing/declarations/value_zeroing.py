"""``value_zeroing``: Value Zeroing (Mohebbi et al., EACL 2023), in closed form from one forward pass.

Zeroing the value vectors of token j in a layer changes each query's attention output by exactly
−Σ_h α^h_ij v^h_j W^h_O; the rest of the block is position-wise, so every zeroing of a layer is one batched pass
through the rest of that block (:mod:`inseq_mixing.methods.value_zeroing`). A chunk's items are zeroed tokens.
"""

from dataclasses import dataclass

from ..methods.options import CONVENTIONS, NORMALIZATIONS, SIMILARITY_METRICS, UNIT_ROWS
from .base import Chunking, Compiling, Declaration, EncoderMaps, Layers, Request, layer_axis, option


@dataclass(frozen=True)
class ValueZeroingOptions(Layers, EncoderMaps, Chunking, Compiling):
    similarity_metric: str = option(
        "cosine", "Distance between corrupted and clean outputs: cosine distance (the paper's) or Euclidean.",
        SIMILARITY_METRICS,
    )  # fmt: skip
    normalization: str = option(
        "separate",
        "'separate': each map's rows sum to 1 (the paper); 'joint': encoder–decoders' source and target rows of a "
        "layer sum to 1 together.",
        NORMALIZATIONS,
    )
    rollout: bool = option(
        False,
        "Return the rollout across layers instead of the layers' mean (encoder–decoders: our extension); it reads "
        "every position's row at every layer below the last, the layers' mean only the explained rows.",
    )
    unit_rows: str = option(
        "mean", "Speech models: a query unit's row is the mean (the speech study's) or max of its frames' rows.",
        UNIT_ROWS,
    )  # fmt: skip
    convention: str = option(
        "paper",
        "'paper': every layer's own output, and on speech models a word's frames are those whose centre lies in "
        "it; 'reference': the speech study's code (Mohebbi et al., EMNLP 2023), which compares transformers' hidden "
        "states: each stack's last layer is measured after the stack's final norm, and a word's frames are "
        "ceil(50·start) to ceil(50·end) inclusive (20 ms frames; neighbouring words may share one).",
        CONVENTIONS,
    )

    def __post_init__(self):
        if self.per_layer and self.rollout:
            raise ValueError(
                "value_zeroing: per_layer=True gives each layer's map and rollout=True one map rolled out through "
                "them: ask for one of the two."
            )


def compute(request: Request, options: ValueZeroingOptions):
    from ..methods.results import LayerMaps
    from ..methods.rollout import normalize_rows
    from ..methods.rollout import rollout as rollout_stack
    from ..methods.value_zeroing import value_zeroing, value_zeroing_layer_mean, value_zeroing_maps

    units = request.units
    encoder = options.output_encoder_self_scores or options.rollout
    first_row = 0 if options.rollout or units is not None else request.first_explained_row()
    if not (options.rollout or options.per_layer or units is not None or request.spec.is_encoder_decoder):
        return value_zeroing_layer_mean(request.trace, options.similarity_metric, options.max_chunk_elements,
                                        first_row, final_norms=options.convention == "reference")  # fmt: skip
    scores = value_zeroing(
        request.trace, options.similarity_metric, encoder, options.max_chunk_elements, units, first_row,
        final_norms=options.convention == "reference",
    )  # fmt: skip
    unit_map = None
    if units is not None:  # audio units are zeroed whole; a query unit's row reduces its frames' rows
        if units.stack == "encoder" and scores.encoder is not None:
            scores.encoder = units.queries(scores.encoder, options.unit_rows)
        elif units.stack == "decoder":
            unit_map = normalize_rows(units.queries(scores.decoder, options.unit_rows))
    if unit_map is not None and options.rollout:  # a CTC or bare speech encoder: frame rows over unit columns
        frame_rows = value_zeroing_maps(scores, options.normalization).target  # (B, L, frames, units)
        below = rollout_stack(unit_map)  # (B, L, units, units): the unit map rolled out, at every depth
        target = frame_rows[:, -1] if frame_rows.shape[1] == 1 else frame_rows[:, -1] @ below[:, -2]
        return LayerMaps(target=target, encoder=below[:, -1])
    maps = value_zeroing_maps(scores, options.normalization, options.rollout)
    if unit_map is not None:
        maps.encoder = unit_map
    if options.rollout:
        return maps
    if not options.per_layer:
        return maps.layer_mean()
    maps.axis = layer_axis(maps.target.shape[1])
    return maps


DECLARATION = Declaration(
    name="value_zeroing",
    rank=8,
    summary="Value Zeroing (Mohebbi et al., EACL 2023), computed in closed form from one forward pass.",
    description=(
        "Zeroing the value vectors of token j in a layer changes each query's attention output by exactly "
        "-Σ_h α^h_ij v^h_j W^h_O; the rest of the block is position-wise, so every zeroing of a layer is one batched "
        "pass through the rest of that block. Scores are the cosine (or Euclidean) distance between corrupted and "
        "clean layer outputs, rows normalised to sum to 1, with no clipping threshold.\n\n"
        "Outputs: one map, the mean of the layers' maps (our choice of one map: the paper reads each layer's; its "
        "rows still sum to 1); per_layer=True: each layer's map (last dimension: layer); rollout=True: the layer maps "
        "rolled out (the authors' code has a rollout too; it reads every position's row at every layer, so on a "
        "decoder it costs the zeroings of the whole prompt, not of the explained rows only). Encoder–decoders: source "
        "= cross-attention zeroing, target = decoder self-attention zeroing (with attribute_target=True, else in "
        "sequence_scores['decoder_self_scores']), encoder self-attention zeroing in "
        "sequence_scores['encoder_self_scores']. Decoder-only: target scores.\n\n"
        "Speech models (inseq_mixing.load_model): the frames of an audio unit (a word, a window, a silence) are "
        "zeroed at once, -Σ_h Σ_(j in unit) α^h_ij v^h_j W^h_O, and a unit's row is the mean (unit_rows='max': the "
        "max) of its frames' rows before normalising. With rollout=True on a CTC or bare speech encoder, the unit "
        "map is rolled out through the layers below the last, and the explained frames' rows of the last layer "
        "(over units) are multiplied by it (our extension; Whisper rolls out its encoder's unit map and enters it "
        "through cross-attention).\n\n"
        "convention='reference' reproduces the speech study's code (Mohebbi et al., EMNLP 2023): each stack's last "
        "layer measured after its final norm (transformers' last hidden state), and a word's frames ceil(50·start) "
        "to ceil(50·end) inclusive; on text models only the first rule applies (our extension of it).\n\n"
        "This method replaces Inseq's built-in value_zeroing, which import inseq_mixing renames to "
        "inseq_value_zeroing."
    ),
    options=ValueZeroingOptions,
    compute=compute,
    pools_units=True,
    paper_layout={"per_layer": True},
    reference_word_frames=True,
    reads_mixers=True,
    unread_mixers={
        "mamba": "zeroing a token's value input changes Mamba's steps and state projections too (they read the same "
        "channels), so no closed form holds; use another method.",
        "mamba_heads": "zeroing a token's value input changes Zamba's selective scan's steps and state projections "
        "too (they read the same channels), so no closed form holds; use another method.",
        "shared_attention": "zeroing a token's value in the shared attention block changes the Mamba-2 mixer's own "
        "input, and with it its steps and state projections, so no closed form holds; use another method.",
    },
)
