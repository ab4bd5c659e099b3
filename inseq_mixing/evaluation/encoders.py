"""The papers' protocols on encoder-only models (through :mod:`inseq_mixing.frontends.encoders`).

Rows have a ``source`` column: the text, with the model's mask token where the target word is (masked LMs), or the
text to classify. Context words are the source's whitespace-separated words (the mask token is one of them); evidence
and cue words are marked among them as for the other models (:mod:`.items`).

- ``cue`` (Value Zeroing paper, BLiMP-style rows): the share of the mask position's row on the cue words, per layer
  for per-layer methods; ``target`` is the masked word (first subword, the ALTI-logit paper's convention).
- ``evidence`` (ALTI-logit paper's protocol on a masked LM): the reciprocal rank of the best evidence word; with a
  ``foil`` column, logit methods explain ``logit(target) − logit(foil)`` at the mask (map methods explain the mask's
  row whatever the foil).
- ``faithfulness`` (AOPC, as DecompX and ALTI evaluate classifiers): the top-ranked ``k%`` of the tokens are deleted
  (comprehensiveness) or kept alone (sufficiency), special tokens and the mask never, and the drop in the explained
  label's (or masked word's) probability and logit is averaged over ``k``; random rankings are the baseline.
  ``target``: a label (classifiers) or the masked word.

A row the front end refuses (no mask token, a word mapped to the unknown token, an unknown label, target and foil on
the same token) is skipped with its reason.
"""

import torch

from .explain import Explanation
from .faithfulness import DEFAULT_FRACTIONS, removal_faithfulness
from .items import EvaluationInputError, Item, Skipped, read_items_skipping
from .protocols import paper_options
from .scores import Evaluation, faithfulness_baseline, faithfulness_result, score_methods
from .text_scores import BASELINES, SCORERS
from .words import word_scores


class EncoderExplanation(Explanation):
    """An item's explanation by an encoder model: one explained entry (the mask, or the label read at the first
    token), source scores ``(tokens, 1[, layers])``."""

    def explained_columns(self) -> list[int]:
        return [0]

    def context_scores(self, columns: int | list[int], per_layer: bool = False) -> torch.Tensor:
        scores = self.seq.source_attributions.float()[:, columns if isinstance(columns, list) else [columns]].sum(1)
        if scores.ndim == 2 and not per_layer:
            scores = scores.mean(-1)
        return word_scores(scores, self.source_words, len(self.item.source.split()))


def explain_encoder_items(attribution, items: list[Item], batch_size: int, options: dict) -> list[EncoderExplanation]:
    """Explanations of ``items`` (checked first with :func:`explainable`) by an
    :class:`~inseq_mixing.frontends.encoders.EncoderAttributionModel`, in batches of rows alike in having a foil (a
    padded batch gives each text what it gets alone)."""
    contrast = attribution.declaration is None or attribution.declaration.explains_logit
    explained = {}
    for with_foil in (False, True):
        group = [item for item in items if (contrast and item.foil is not None) == with_foil]
        for start in range(0, len(group), batch_size):
            batch = group[start : start + batch_size]
            targets = [attribution.split_target(item.target) if item.target else None for item in batch]
            foils = [attribution.split_target(item.foil) for item in batch] if with_foil else None
            out = attribution.attribute([item.source for item in batch], targets, foils, batch_size=len(batch),
                                        show_progress=False, **options)  # fmt: skip
            for item, seq in zip(batch, out.sequence_attributions, strict=True):
                explained[item.row] = EncoderExplanation(item, seq, attribution.source_words(seq, item.source), [])
    return [explained[item.row] for item in items]


def explainable(attribution, item: Item) -> Skipped | None:
    """Why ``item`` cannot be explained by ``attribution``'s model (checked without running it), or None."""
    tokenizer = attribution.tokenizer
    if attribution.task == "masked_lm" and tokenizer.mask_token_id not in tokenizer(item.source).input_ids:
        reason = f"Row {item.row} has no mask token: the protocols explain the masked word ({tokenizer.mask_token})"
        return Skipped(item.row, reason, "not explainable")
    try:
        target = attribution.split_target(item.target) if item.target else None
        foil = None if item.foil is None else attribution.split_target(item.foil)
        attribution.validate(item.source, target, foil, names=[f"Row {item.row}"])
        if target is not None and foil is not None and _same_output(attribution, target, foil):
            what = "explained token" if attribution.task == "masked_lm" else "label"
            return Skipped(
                item.row,
                f"Row {item.row}: target {item.target!r} and foil {item.foil!r} share their {what}, so "
                "logit(target) − logit(foil) is 0 for every token",
                "target equals foil",
            )
    except ValueError as error:
        return Skipped(item.row, str(error), "not explainable")
    return None


def _same_output(attribution, target, foil) -> bool:
    """Whether a target and its foil (one value, or one per explained entry) name the same output row anywhere: a
    word's first subword, or a label by name or index."""
    targets = [target] if isinstance(target, str | int) else list(target)
    foils = [foil] if isinstance(foil, str | int) else list(foil)
    return any(
        attribution.output_index(a) == attribution.output_index(b) for a, b in zip(targets, foils, strict=False)
    )


def encoder_faithfulness(attribution, explanations, fractions=DEFAULT_FRACTIONS, random_draws: int = 3, seed=0):
    """AOPC by deletion for every explanation of ``attribution``'s method (see the module docstring): per row, the
    metrics of the method's ranking and of ``random_draws`` random rankings (``random_*``)."""
    generator = torch.Generator().manual_seed(seed)
    special = set(attribution.tokenizer.all_special_ids)
    rows = []
    for explanation in explanations:
        seq = explanation.seq
        ids = torch.tensor([token.id for token in seq.source])
        cell = _explained_cell(attribution, ids)
        candidates = torch.tensor([int(i) not in special and n != cell for n, i in enumerate(ids.tolist())])
        scores = seq.source_attributions.float()[:, 0]
        scores = scores.mean(-1) if scores.ndim == 2 else scores
        read = _reader(attribution, ids, cell, seq.target[0].id)
        rows.append(removal_faithfulness(read, scores, candidates, fractions, random_draws, generator))
    return rows


def _explained_cell(attribution, ids: torch.Tensor) -> int:
    if attribution.task == "masked_lm":
        return int((ids == attribution.tokenizer.mask_token_id).nonzero()[0])
    return 0


def _reader(attribution, ids: torch.Tensor, cell: int, target: int):
    """The explained probability and logit for rows of kept-token masks ``(rows, tokens)``: each row's kept tokens
    are re-encoded without the deleted ones (right padding), the explained cell moved to its new index."""
    model = attribution.model

    @torch.no_grad()
    def read(kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = kept.sum(1)
        inputs = torch.full((len(kept), int(lengths.max())), attribution.tokenizer.pad_token_id)
        mask = torch.zeros_like(inputs)
        for row, keep in enumerate(kept):
            inputs[row, : lengths[row]] = ids[keep]
            mask[row, : lengths[row]] = 1
        cells = kept[:, :cell].sum(1)
        logits = model(input_ids=inputs.to(attribution.device), attention_mask=mask.to(attribution.device)).logits
        logits = (logits[torch.arange(len(kept)), cells] if logits.dim() == 3 else logits).float().cpu()
        return logits.softmax(-1)[:, target], logits[:, target]

    return read


def compare_encoder(model, methods: list[str], texts, targets, found, settings):
    """:func:`~inseq_mixing.compare` on an encoder model: each method on the same texts, the first explained entry of
    each text (a mask, or the label) scored by AOPC with deletion (see the module docstring), and the Spearman
    agreement of every two methods over the candidate tokens."""
    from types import SimpleNamespace

    from ..frontends import as_front_end, load_model

    attribution = as_front_end(model, methods[0], found, tokenizer=settings.tokenizer)
    from .comparison import Comparison, each_method, fill_one_entry, texts_of, with_explained

    texts = texts_of(texts)
    targets = [targets] if isinstance(targets, str) else targets
    fractions, random_draws, method_kwargs = settings.fractions, settings.random_draws, settings.method_kwargs
    show_progress, attributed_fn = settings.show_progress, settings.attributed_fn

    comparison = Comparison()

    def attribute(method: str):
        front = load_model(attribution, method)  # the same model and tokenizer, with this method
        out = front.attribute(texts, targets, show_progress=False,
                              **with_explained(method, method_kwargs.get(method, {}), attributed_fn))  # fmt: skip
        explained = [SimpleNamespace(seq=seq) for seq in out.sequence_attributions]
        return out, encoder_faithfulness(front, explained, fractions, random_draws)

    done = each_method(methods, attribute, comparison.failed, "compare", show_progress, "attributing", stacklevel=4)
    return fill_one_entry(comparison, done, lambda sequence: _candidate_scores(attribution, sequence))


def _candidate_scores(attribution, seq) -> torch.Tensor:
    """The first explained entry's scores of the tokens AOPC may delete (special tokens and the mask excluded)."""
    ids = torch.tensor([token.id for token in seq.source])
    cell = _explained_cell(attribution, ids)
    special = set(attribution.tokenizer.all_special_ids)
    keep = torch.tensor([int(i) not in special and n != cell for n, i in enumerate(ids.tolist())])
    scores = seq.source_attributions.float()[:, 0]
    return (scores.mean(-1) if scores.ndim == 2 else scores)[keep]


def evaluate_encoder(model, methods: list[str], data, protocol: str, found, settings) -> Evaluation:
    """:func:`evaluate` on an encoder-only model (:mod:`.encoders`): the rows every method can explain, then each
    method on them."""
    from ..frontends import as_front_end, load_model

    model = as_front_end(model, methods[0], found, tokenizer=settings.tokenizer, device=settings.device)
    batch_size, draws, seed, columns = settings.batch_size, settings.draws, settings.seed, settings.columns
    examples, random_draws, method_kwargs = settings.examples, settings.random_draws, settings.method_kwargs
    items, skipped = read_items_skipping(data, protocol, True, columns)
    evaluation = Evaluation(protocol, draws=draws, seed=seed, skipped=skipped)
    kept = []
    for item in items:  # the rows no method can explain, with the reason, before any method runs
        refused = explainable(model, item)
        if refused is None:
            kept.append(item)
        else:
            evaluation.skipped.append(refused)
    evaluation.skipped.sort(key=lambda skip: skip.row)
    if not kept:
        reasons = "; ".join(skip.reason for skip in evaluation.skipped[:3])
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}.")
    faithfulness_rows = {}

    def score(method: str):
        attribution = load_model(model, method)  # the same model and tokenizer, with this method
        options = paper_options(method, method_kwargs.get(method, {}), protocol)
        explained = explain_encoder_items(attribution, kept, batch_size, options)
        if protocol != "faithfulness":
            return SCORERS[protocol](explained), explained
        rows = encoder_faithfulness(attribution, explained, random_draws=random_draws, seed=seed)
        faithfulness_rows[method] = rows
        return faithfulness_result(rows), explained

    score_methods(evaluation, methods, score, examples, settings.show_progress)
    if protocol == "faithfulness":
        evaluation.baseline = faithfulness_baseline(next(iter(faithfulness_rows.values())))
    else:
        evaluation.baseline = BASELINES[protocol](kept)
    return evaluation


def stored_faithfulness(front, run, ids, sequences, random_draws: int, seed: int, show_progress: bool):
    """A stored encoder run's faithfulness: each example's first explained entry, by deletion."""
    from types import SimpleNamespace

    explained = [SimpleNamespace(seq=sequence) for sequence in sequences]
    return encoder_faithfulness(front, explained, DEFAULT_FRACTIONS, random_draws, seed), None
