"""Running a method over evaluation items and reading word-level scores of the explained token off Inseq's outputs.

Items without a foil go through the dataset runner's batched attribution (one trace per batch for the plugin's
methods). Items with a foil are explained one by one, contrastively: ``contrast_logits_diff`` for the plugin's logit
methods (``alti_logit``, ``decompx``), Inseq's ``contrast_prob_diff`` for its gradient and perturbation methods; the
plugin's map methods (``value_zeroing``, ``alti``) have no contrastive form and explain the target word itself.
"""

from dataclasses import dataclass

import torch

from ..frontends.generation import attribute_texts, split_arguments
from .comparison import token_level_scores
from .items import Item
from .words import token_words, word_scores


@dataclass
class Explanation:
    """One item's Inseq sequence output and the word of each of its source and target tokens."""

    item: Item
    seq: object
    source_words: list[int] | None
    target_words: list[int]
    image: object = None  # an image example's picture (the report draws the scores over it)

    def column(self, position: int) -> int:
        """Column of Inseq's attributions that explains the token at target ``position``."""
        column = position - self.seq.attr_pos_start
        if not 0 <= column < self.seq.target_attributions.shape[1]:
            raise ValueError(f"Row {self.item.row}: target position {position} was not attributed.")
        return column

    def explained_columns(self) -> list[int]:
        """Columns of the explained token(s): every token of the target-side words after the prefix."""
        first = len(self.item.prefix.split())
        columns = [self.column(position) for position, owner in enumerate(self.target_words) if owner >= first]
        if not columns:
            raise ValueError(f"Row {self.item.row}: no token of the target {self.item.target!r} was attributed.")
        return columns

    def context_scores(self, columns: int | list[int], per_layer: bool = False) -> torch.Tensor:
        """Scores of the context words (source words, then prefix words) for the explained column(s), summed over
        columns: ``(words,)``, or ``(words, layers)`` with ``per_layer`` for a per-layer method."""
        columns = [columns] if isinstance(columns, int) else list(columns)
        source, target = _token_scores(self.seq, per_layer)
        num_source = len((self.item.source or "").split())
        num_prefix = len(self.item.prefix.split())
        prefix = word_scores(target[:, columns].nan_to_num().sum(1), self.target_words, num_prefix)
        if source is None:
            return prefix
        return torch.cat([word_scores(source[:, columns].nan_to_num().sum(1), self.source_words, num_source), prefix])

    def source_target_scores(self) -> torch.Tensor:
        """``(source words, target words)`` scores: each target word's columns (the predictions of its tokens)
        averaged, source tokens summed into words."""
        source, _ = _token_scores(self.seq, per_layer=False)
        num_source, num_target = len(self.item.source.split()), len(self.item.target.split())
        words = word_scores(source, self.source_words, num_source)  # (source words, generated columns)
        matrix = words.new_zeros(num_source, num_target)
        for word in range(num_target):
            columns = [self.column(p) for p, owner in enumerate(self.target_words) if owner == word]
            matrix[:, word] = words[:, columns].mean(1)
        return matrix


def _token_scores(seq, per_layer: bool):
    """Source and target token scores ``(tokens, generated[, layers])``: Inseq's reductions, with the layer axis of a
    per-layer method kept when asked."""
    granular = type(seq).__name__.startswith("Granular")
    if per_layer and not granular and seq.target_attributions.ndim == 3:
        source = None if seq.source_attributions is None else seq.source_attributions.float()
        return source, seq.target_attributions.float()
    return token_level_scores(seq)


def is_per_layer(seq) -> bool:
    """Whether an output has a layer axis (per-layer context-mixing maps); encoder outputs have source scores only."""
    scores = seq.target_attributions if seq.target_attributions is not None else seq.source_attributions
    return not type(seq).__name__.startswith("Granular") and scores.ndim == 3


def contrast_function(attribution_model) -> str | None:
    """The attributed function that explains a target against a foil, or None for methods without one."""
    from ..frontends.inseq_adapter.base import ContextMixingAttribution

    method = attribution_model.attribution_method
    if isinstance(method, ContextMixingAttribution):
        return "contrast_logits_diff" if method.use_predicted_target else None
    return "contrast_prob_diff"


def explain_items(attribution_model, items: list[Item], batch_size: int, options: dict) -> list[Explanation]:
    """Attribute every item with the model's current method (batched where no foil is given)."""
    from ..frontends.inseq_adapter.base import ContextMixingAttribution

    encoder_decoder = attribution_model.is_encoder_decoder
    if isinstance(attribution_model.attribution_method, ContextMixingAttribution):
        inseq_args, options = split_arguments(attribution_model, dict(options))
    else:
        inseq_args = {"attribute_target": encoder_decoder}
    contrast_fn = contrast_function(attribution_model)
    outputs: dict[int, object] = {}
    plain = [item for item in items if item.foil is None or contrast_fn is None]
    for start in range(0, len(plain), batch_size):
        batch = plain[start : start + batch_size]
        sources = [item.source if encoder_decoder else item.prefix for item in batch]
        targets = [item.generated_text for item in batch]
        result = attribute_texts(attribution_model, sources, targets, inseq_args, options)
        outputs.update(zip((item.row for item in batch), result.sequence_attributions, strict=True))
    for item in items:
        if item.row not in outputs:
            outputs[item.row] = explain_contrast(attribution_model, item, contrast_fn, inseq_args, options)
    return [word_mapping(attribution_model, item, outputs[item.row]) for item in items]


def explain_contrast(attribution_model, item: Item, contrast_fn: str, inseq_args: dict, options: dict):
    """One item's contrastive explanation (target word against foil word)."""
    encoder_decoder = attribution_model.is_encoder_decoder
    try:
        result = attribution_model.attribute(
            item.source if encoder_decoder else item.prefix,
            item.generated_text,
            attribute_target=inseq_args.get("attribute_target", encoder_decoder),
            attributed_fn=contrast_fn,
            contrast_targets=item.contrast_text,
            show_progress=False,
            **options,
        )
    except ValueError as error:
        if "contrastive" in str(error).lower():
            raise ValueError(
                f"{attribution_model.attribution_method.method_name} cannot explain a target against a foil in "
                f"Inseq ({error}): evaluate it on data without a foil column, or use a method that supports "
                "contrastive attribution (e.g. saliency, input_x_gradient)."
            ) from error
        raise
    return result.sequence_attributions[0]


def word_mapping(attribution_model, item: Item, seq) -> Explanation:
    """The :class:`Explanation` of an item: which word each attributed token belongs to."""
    tokenizer = attribution_model.tokenizer
    target_ids = [token.id for token in seq.target]
    if attribution_model.is_encoder_decoder:
        source_words = token_words(tokenizer, item.source, [token.id for token in seq.source])
        target_words = token_words(tokenizer, item.generated_text, target_ids, as_target=True)
    else:
        source_words = None
        target_words = token_words(tokenizer, item.generated_text, target_ids)
    return Explanation(item, seq, source_words, target_words)


def explanations(sequences: list) -> list[Explanation]:
    """The report's explanations of stored or speech sequences (row numbers in order; the target is the explained
    entries)."""
    return [
        Explanation(Item(row, None, "", " ".join(token.token for token in sequence.target)), sequence, None, [])
        for row, sequence in enumerate(sequences)
    ]
