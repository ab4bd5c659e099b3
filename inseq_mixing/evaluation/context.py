"""The ``context`` protocol: did a method find the passage an answer came from (our protocol, after the passage- and
sentence-level evaluations of ContextCite and AT2)?

Rows: ``passages`` (a list of texts, or one text cut at ``separator``), ``question`` (optional: what follows the
passages), ``answer`` (optional: the model's greedy generation), ``gold`` (the index, or a list of indices, of the
passage(s) that hold the answer). The prompt is the passages then the question, joined by ``separator``
(decoder-only models: the answer follows it; encoder–decoders: it is the source). Each method explains the whole
answer as one span over the passages as units (``model.attribute(..., spans="answer", units=passages,
hops=...)``; :mod:`inseq_mixing.frontends.spans`).

Metrics, per row, averaged over rows:

- ``mrr``: ``1 / rank`` of the best-ranked gold passage among the passages (scores descending; tied passages share
  their mean rank);
- ``recall_at_1``: 1 when a gold passage is ranked first alone;
- ``probability_drop``: the answer's probability (teacher-forced, the product of its tokens' probabilities) with every
  passage, minus its probability when the top-ranked passage is taken out of the prompt;
- with ``hops``: ``mrr_hop{h}`` and ``recall_at_1_hop{h}`` for the scores after ``h`` hops, ``h = 0 .. hops``
  (the headline ``mrr`` is after every hop).

Baseline: a uniform random ranking, in closed form: its expected MRR (:func:`.metrics.random_reciprocal_rank`),
recall ``|gold| / passages``, and the mean drop over every passage taken out (each row's drops are measured for every
passage once, whatever the method).
"""

from __future__ import annotations

import json

import torch

from ..runs.data import cell_value, read_rows
from .explain import Explanation
from .items import EvaluationInputError, Item, Skipped
from .metrics import mean_statistic, nan_mean, random_reciprocal_rank, tied_ranks
from .scores import Evaluation, MethodResult, score_methods

#: Column names by role.
CONTEXT_COLUMNS = {"passages": "passages", "question": "question", "answer": "answer", "gold": "gold"}
CONTEXT_METRICS = ("mrr", "recall_at_1", "probability_drop")
DESCRIPTION = (
    "Each method explains the whole answer as one span over the passages of the prompt (units). mrr: 1/rank of the "
    "best-ranked gold passage; recall_at_1: a gold passage ranked first; probability_drop: the answer's probability "
    "with every passage minus without the top-ranked one. The baseline is a uniform random ranking (exact "
    "expectations; its drop is the mean over every passage taken out)."
)


def evaluate_context(
    base,
    methods: list[str],
    data,
    *,
    method_kwargs: dict | None = None,
    hops: int = 0,
    separator: str = "\n\n",
    batch_size: int = 16,
    draws: int = 1000,
    seed: int = 0,
    examples: int = 2,
    show_progress: bool = False,
    columns: dict[str, str] | None = None,
) -> Evaluation:
    """The ``context`` protocol on a generation model (see the module docstring).

    Args:
        base: An Inseq ``AttributionModel`` of the model (any method: each method is loaded on the same model).
        methods: This package's method names.
        data: The rows (a JSONL/CSV/Parquet path, a DataFrame, a ``datasets.Dataset`` or a list of dicts).
        method_kwargs: Per method, its options.
        hops: Hops through the generated tokens before each answer token (0: none).
        separator: What joins the passages and the question (and cuts a passages text).
        batch_size: Rows per attribution call.
        draws: Bootstrap resamples and permutations.
        seed: Seed of the resampling.
        examples: Explanations kept per method for the report.
        show_progress: Show a progress bar over the methods.
        columns: Column names by role (``passages``, ``question``, ``answer``, ``gold``).

    Raises:
        EvaluationInputError: No row that can be evaluated, or a column missing.
    """
    import inseq

    from ..frontends.spans import check_span_arguments, generated_continuations

    check_span_arguments(hops=hops)
    rows, skipped = read_context_rows(data, columns or {}, separator)
    if not rows:
        reasons = "; ".join(skip.reason for skip in skipped[:3])
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}.")
    encoder_decoder = base.is_encoder_decoder
    missing = [row for row in rows if row["answer"] is None]
    if missing:
        with _bar(len(missing), "context: generating the missing answers", "row", show_progress) as bar:
            generated = generated_continuations(base, [row["prompt"] for row in missing], {})  # one call, as before
            for row, text in zip(missing, generated, strict=True):
                row["answer"] = text
            bar.update(len(missing))
    rows = _explainable_rows(base, methods, rows, skipped, separator)
    if not rows:
        reasons = "; ".join(skip.reason for skip in skipped[:3])
        raise EvaluationInputError(f"No row of the data can be explained: {reasons}.")
    drops = []
    with _bar(len(rows), "context: the answer without each passage (probability drops)", "row", show_progress) as bar:
        for row in rows:
            drops.append(passage_drops(base.model, base.tokenizer, row, separator, encoder_decoder))
            bar.update()
    evaluation = Evaluation("context", draws=draws, seed=seed, skipped=skipped)
    per_hop = [f"{metric}_hop{hop}" for hop in range(hops + 1) for metric in ("mrr", "recall_at_1")] if hops else []
    evaluation.metric_names = (*CONTEXT_METRICS, *per_hop)
    evaluation.description = DESCRIPTION
    method_kwargs = method_kwargs or {}

    def score(method: str):
        model = inseq.load_model(base.model, method, tokenizer=base.tokenizer)
        sequences = []
        bar = _bar(len(rows), f"context: {method} explains each answer over its passages", "row", show_progress)
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            texts = [row["answer"] if encoder_decoder else row["prompt"] + row["answer"] for row in chunk]
            out = model.attribute([row["prompt"] for row in chunk], texts, spans="answer",
                                  units=[row["passages"] for row in chunk], hops=hops, batch_size=len(chunk),
                                  separator=separator, show_progress=False,
                                  **method_kwargs.get(method, {}))  # fmt: skip
            sequences += out.sequence_attributions
            bar.update(len(chunk))
        bar.close()
        found = [row_metrics(row, sequence, drop, hops) for row, sequence, drop in zip(rows, sequences, drops,
                                                                                        strict=True)]  # fmt: skip
        statistics = {metric: mean_statistic([value[metric] for value in found]) for metric in evaluation.metrics}
        shown = [Explanation(Item(row["row"], None, row["question"], row["answer"]), sequence, None, [])
                 for row, sequence in zip(rows, sequences, strict=True)]  # fmt: skip
        return MethodResult(statistics), shown

    score_methods(evaluation, methods, score, examples, show_progress)
    random_mrr = [random_reciprocal_rank(len(row["passages"]), len(row["gold"])) for row in rows]
    random_recall = [len(row["gold"]) / len(row["passages"]) for row in rows]
    evaluation.baseline = {"mrr": nan_mean(random_mrr), "recall_at_1": nan_mean(random_recall),
                           "probability_drop": nan_mean([float(drop[1:].mean()) for drop in drops])}  # fmt: skip
    for hop in range(hops + 1 if hops else 0):
        evaluation.baseline[f"mrr_hop{hop}"] = evaluation.baseline["mrr"]
        evaluation.baseline[f"recall_at_1_hop{hop}"] = evaluation.baseline["recall_at_1"]
    return evaluation


def _bar(total: int, description: str, unit: str, show: bool):
    """A progress bar named for its step, shown from the step's start (a long step never runs silent)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, unit=unit, disable=not show)


def _explainable_rows(base, methods: list[str], rows: list[dict], skipped: list[Skipped], separator: str) -> list:
    """The rows whose answer and passages the span front end takes (found from their tokens, before the model runs):
    an answer without a token, or a passage without a token of its own (its tokens all shared with a neighbour), is
    skipped with its reason."""
    import inseq

    from ..declarations import DECLARATIONS
    from ..frontends.spans import SpanAttributionModel

    ours = [method for method in methods if method in DECLARATIONS]
    if not ours:  # no method of this package: each one fails with its own error
        return rows
    front = SpanAttributionModel(inseq.load_model(base.model, ours[0], tokenizer=base.tokenizer))
    kept = []
    for row in rows:
        text = row["answer"] if base.is_encoder_decoder else row["prompt"] + row["answer"]
        name = f"Row {row['row']}"
        try:
            item = front.item_of(name, row["prompt"], text, units=row["passages"], separator=separator)
            if item.unit_texts[: len(row["passages"])] != row["passages"]:
                lost = [passage for passage in row["passages"] if passage not in item.unit_texts]
                raise ValueError(
                    f"{name}: the passage(s) {lost!r} have no token of their own (each of their tokens "
                    "is shared with a neighbour): join them to a neighbour or cut them elsewhere."
                )
        except ValueError as error:
            skipped.append(Skipped(row["row"], str(error), "not explainable"))
            continue
        kept.append(row)
    return kept


def row_metrics(row: dict, sequence, drops: torch.Tensor, hops: int) -> dict:
    """One row's metrics from its span output (units: the passages first) and its passages' drops."""
    count = len(row["passages"])
    scores = sequence.source_attributions[:count, 0].double()
    scores = scores if scores.dim() == 1 else scores.sum(-1)  # per-layer maps: their sum over layers
    values = ranking_metrics(scores, row["gold"])
    top = int(scores.argmax())
    values["probability_drop"] = float(drops[1 + top])
    if hops:
        parts = sequence.sequence_scores["hops"][:count, 0].double()  # (passages, hops + 1)
        for hop in range(hops + 1):
            for metric, value in ranking_metrics(parts[:, : hop + 1].sum(-1), row["gold"]).items():
                values[f"{metric}_hop{hop}"] = value
    return values


def ranking_metrics(scores: torch.Tensor, gold: list[int]) -> dict:
    """``mrr`` and ``recall_at_1`` of the gold passages under ``scores`` (higher first)."""
    ranks = tied_ranks(scores)[gold]
    return {"mrr": float(1 / ranks.min()), "recall_at_1": float(ranks.min() == 1)}


@torch.no_grad()
def passage_drops(model, tokenizer, row: dict, separator: str, encoder_decoder: bool) -> torch.Tensor:
    """``(1 + passages,)``: the answer's probability with every passage, then for each passage how much lower it is
    when that passage is taken out of the prompt (one padded forward pass)."""
    passages = row["passages"]
    without = [prompt_of(passages[:index] + passages[index + 1 :], row["question"], separator)
               for index in range(len(passages))]  # fmt: skip
    prompts = [row["prompt"], *without]
    probabilities = answer_probabilities(model, tokenizer, prompts, row["answer"], encoder_decoder)
    return torch.cat([probabilities[:1], probabilities[0] - probabilities[1:]])


@torch.no_grad()
def answer_probabilities(model, tokenizer, prompts: list[str], answer: str, encoder_decoder: bool) -> torch.Tensor:
    """``(prompts,)``: the probability of ``answer`` after each prompt, teacher-forced: the product over the answer's
    tokens that are not markup (those a span explains: an unknown word's token is one) of their probabilities, in one
    right-padded forward pass."""
    from ..frontends.words import markup_ids

    device = next(model.parameters()).device
    special = markup_ids(tokenizer)
    rows, chosen = [], []
    if encoder_decoder:
        target = list(tokenizer(text_target=answer)["input_ids"])
        ids = [model.config.decoder_start_token_id, *target]
        kept = [index for index in range(1, len(ids)) if ids[index] not in special]
        source = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
        decoder = torch.tensor([ids] * len(prompts), device=device)
        logits = model(**source, decoder_input_ids=decoder).logits
        chosen = [kept] * len(prompts)
        rows = [ids] * len(prompts)
    else:
        for prompt in prompts:
            encoded = tokenizer(prompt + answer, return_offsets_mapping=True)
            ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
            rows.append(ids)
            chosen.append([index for index, (begin, end) in enumerate(offsets) if index > 0 and end > begin
                           and begin >= len(prompt) and ids[index] not in special])  # fmt: skip
        length = max(len(ids) for ids in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        padded = torch.tensor([ids + [pad] * (length - len(ids)) for ids in rows], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * (length - len(ids)) for ids in rows], device=device)
        logits = model(input_ids=padded, attention_mask=mask).logits
    log_probs = logits.double().log_softmax(-1)
    totals = [sum(float(log_probs[row, index - 1, ids[index]]) for index in kept)
              for row, (ids, kept) in enumerate(zip(rows, chosen, strict=True))]  # fmt: skip
    return torch.tensor(totals, dtype=torch.float64).exp()


def read_context_rows(data, columns: dict[str, str], separator: str) -> tuple[list[dict], list[Skipped]]:
    """The rows that can be evaluated (``row``, ``passages``, ``question``, ``prompt``, ``answer``, ``gold``), and
    the others with the reason."""
    names = {**CONTEXT_COLUMNS, **{role: name for role, name in columns.items() if role in CONTEXT_COLUMNS and name}}
    rows, skipped = [], []
    for index, raw in enumerate(read_rows(data)):
        if index == 0:
            for role in ("passages", "gold"):
                if names[role] not in raw:
                    raise EvaluationInputError(f"The data has no column {names[role]!r} (the {role}).")
        try:
            rows.append(_context_row(index, raw, names, separator))
        except ValueError as error:
            skipped.append(Skipped(index, f"Row {index}: {error}"))
    return rows, skipped


def _context_row(index: int, raw: dict, names: dict, separator: str) -> dict:
    passages = _listed(raw.get(names["passages"]))
    if isinstance(passages, str):
        passages = [part for part in passages.split(separator) if part.strip()]
    if not isinstance(passages, list) or len(passages) < 2 or not all(isinstance(p, str) and p.strip()
                                                                       for p in passages):  # fmt: skip
        raise ValueError("passages must be at least two non-empty texts (a list, or one text cut at the separator).")
    gold = cell_value(raw.get(names["gold"]))  # "1" or "[0, 2]" in a CSV cell, 1.0 in a column with a gap
    gold = [cell_value(g) for g in gold] if isinstance(gold, list) else [gold] if isinstance(gold, int) else gold
    whole = isinstance(gold, list) and all(isinstance(g, int) and not isinstance(g, bool) for g in gold)
    if not whole or not gold or not all(0 <= g < len(passages) for g in gold):
        raise ValueError(f"gold must be the index (or a list of indices) of passages 0..{len(passages) - 1}, "
                         f"not {raw.get(names['gold'])!r}.")  # fmt: skip
    question = raw.get(names["question"]) or ""
    answer = raw.get(names["answer"])
    answer = None if answer is None or (isinstance(answer, float) and answer != answer) or answer == "" else answer
    return {"row": index, "passages": passages, "question": question, "answer": answer, "gold": sorted(set(gold)),
            "prompt": prompt_of(passages, question, separator)}  # fmt: skip


def prompt_of(passages: list[str], question: str, separator: str) -> str:
    """The prompt: the passages, then the question if there is one, joined by ``separator``."""
    return separator.join([*passages, *([question] if question else [])])


def _listed(value):
    """A list given as JSON text (a CSV cell) read as a list; numpy arrays and integers as Python ones."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def run_context(model, methods: list[str], data, protocol: str, found, settings) -> Evaluation:
    """The context protocol (the protocol registry's entry: :func:`evaluate_context`)."""
    from ..frontends import as_front_end

    base = as_front_end(model, methods[0], found, tokenizer=settings.tokenizer, device=settings.device)
    return evaluate_context(base, methods, data, method_kwargs=settings.method_kwargs, hops=settings.hops,
                            separator=settings.separator, batch_size=settings.batch_size, draws=settings.draws,
                            seed=settings.seed, examples=settings.examples, show_progress=settings.show_progress,
                            columns=settings.columns)  # fmt: skip
