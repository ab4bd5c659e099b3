"""Declared options: one field helper and the option pieces several methods share, each written once.

A method's options are a frozen dataclass whose fields are made with :func:`option` (a default, one line of
documentation, and the accepted strings where there are a few); shared options come from inheriting the pieces below.
The Inseq adapter, the CLI and the dataset runner read names, defaults, documentation and choices from these fields.
"""

import dataclasses
from dataclasses import dataclass, field

from .chunking import DEFAULT_CHUNK_ELEMENTS


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
class EncoderMaps:
    output_encoder_self_scores: bool = option(
        True, "Encoder–decoders: return the encoder's own map in sequence_scores['encoder_self_scores']."
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
