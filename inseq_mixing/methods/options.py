"""Declared options: one field helper and the option pieces several methods share, each written once.

A method's options are a frozen dataclass whose fields are made with :func:`option` (a default, one line of
documentation, and the accepted strings where there are a few); shared options come from inheriting the pieces below.
The Inseq adapter, the CLI and the dataset runner read names, defaults, documentation and choices from these fields.
"""

import dataclasses
from dataclasses import dataclass, field

from .chunking import DEFAULT_CHUNK_ELEMENTS

#: How value zeroing reduces an audio unit's frame rows (speech models).
UNIT_ROWS = ("mean", "max")


def option(default, doc: str, choices: tuple[str, ...] | None = None):
    """A declared option: its default, one line of documentation, and (for string options) the accepted values."""
    return field(default=default, metadata={"doc": doc, "choices": choices})


@dataclass(frozen=True)
class Chunking:
    max_chunk_elements: int = option(
        DEFAULT_CHUNK_ELEMENTS,
        "Bound on the elements of the largest temporary tensor of one chunk (the method's docstring says what one "
        "item of a chunk is); at least one item per chunk (see inseq_mixing.methods.chunking).",
    )


@dataclass(frozen=True)
class Compiling:
    compile: bool = option(
        False,
        "Run the method's hot per-chunk steps as kernels compiled by torch.compile (see "
        "inseq_mixing.methods.compiled): faster on long dataset runs; the first call compiles them (seconds).",
    )


@dataclass(frozen=True)
class EncoderMaps:
    output_encoder_self_scores: bool = option(
        True, "Encoder–decoders: return the encoder's own map in sequence_scores['encoder_self_scores']."
    )


@dataclass(frozen=True)
class Layers:
    per_layer: bool = option(
        False,
        "One map per layer (last dimension: layer, named in info['score_axis']) instead of the default one map; what "
        "a layer's map is, per method: docs/methods/index.md's table of layouts.",
    )


@dataclass(frozen=True)
class Heads:
    per_head: bool = option(False, "Split the scores by attention head on the last axis (our extension).")


@dataclass(frozen=True)
class Contrast:
    contrast_targets: str | list[str] | None = option(
        None,
        "A contrastive target text: explain logit(target) − logit(foil), the foil being the aligned token of this "
        "text at each step (also read from Inseq's attributed_fn='contrast_logits_diff').",
    )
    contrast_targets_alignments: list | None = option(
        None, "(target index, contrast index) pairs, as in Inseq; default 1:1."
    )


def check_choices(options, what: str) -> None:
    """Refuse a string option outside its declared choices (called by options dataclasses after init)."""
    for item in dataclasses.fields(options):
        choices = item.metadata.get("choices")
        value = getattr(options, item.name)
        if choices is not None and value not in choices:
            raise ValueError(f"{what} {item.name}={value!r} is unknown: use one of {choices}.")


# ----- the options of one method, here so that reading them needs no torch -----

SIMILARITY_METRICS = ("cosine", "euclidean")
NORMALIZATIONS = ("separate", "joint")
BIAS_SPLITS = ("absdot", "norm", "equal", "separate")
FFN_LINEARIZATIONS = ("zero_origin", "tangent")
CONVENTIONS = ("paper", "reference")
GATED_SPLITS = ("linear", "gate")


@dataclass(frozen=True)
class DecompXOptions(Chunking, Compiling):
    """Choices of the decomposition (each field's documentation is in its declaration below; ``max_chunk_elements``
    bounds the largest temporary of a chunk: a block of the stored stream (positions × components × d_model), an
    attention slab (positions × components × d_model) or FFN activations (positions × components × d_ff); the
    decomposed stream itself holds about n²/2 × d_model elements for n causal positions)."""

    bias: str = option(
        "absdot",
        "How biases are split over token components: by |component · bias| ('absdot', the paper's default), by "
        "component norm ('norm'), equally over the tokens available at the position ('equal'), or kept in one extra "
        "bias component ('separate', returned in step_scores['unattributed_bias']).",
        BIAS_SPLITS,
    )
    ffn_linearization: str = option(
        "zero_origin",
        "The activation's slope at the true pre-activation: f(z)/z ('zero_origin', exact) or f'(z) ('tangent', the "
        "intercept split like a bias).",
        FFN_LINEARIZATIONS,
    )
    gated_split: str = option(
        "linear",
        "Gated FFNs (SwiGLU, gated-GELU): decompose the 'linear' branch with the gate held at its true value, or the "
        "'gate' branch with the linear branch held.",
        GATED_SPLITS,
    )
    include_ffn: bool = option(True, "Decompose through the FFNs; with False each FFN output is split like a bias.")
    convention: str = option(
        "paper",
        "'paper' (the paper's text: an attention sub-block's bias split over the attention output's components, the "
        "logit bias by the components' scores for the explained token) or 'reference' (the authors' released code: "
        "the attention bias split over the residual plus the attention output, the first layer's value bias kept in "
        "each token's own value, the logit bias by each component's whole logit vector, its dot product with the "
        "bias over the vocabulary for 'absdot' or its norm for 'norm'; on BERT classifiers it gives the released "
        "code's scores, see scripts/compare_with_authors.py).",
        CONVENTIONS,
    )

    def __post_init__(self):
        check_choices(self, "DecompX")
