"""The protocols on vision–language decoders (our extension: the methods' papers evaluate text and speech): the
pointing game (does the answer's explanation point into the image region the answer names?) and faithfulness by
image tokens (deletion and insertion curves, AOPC).

Rows (JSONL, CSV, Parquet, a DataFrame or dicts): ``images`` (a path, or a JSON list of paths, one per placeholder of
the prompt), ``prompt``, ``answer`` (the phrase explained, teacher-forced: required, since the region is the
phrase's) and, for ``pointing``, ``box`` (``[x0, y0, x1, y1]`` in the first image's own pixels, a list or its JSON).
Each method explains the answer as one span (``spans="answer"``: its summed logit, a map method's mean row) over the
tokens; the first image's tokens are the ranked items (the text's and the other images' are never ranked).

``pointing``. An image token is in the box when at least half of its cell is: its cell is its place on the token grid
stretched over the part of the image the grid covers (``info["image_boxes"]``: LLaVA's processor keeps the centred
square, Qwen2-VL's the whole image). ``pointing_game`` is 1 when the highest-scored image token is in the box (ties:
the first in reading order), ``gold_share`` the share of the positive image-token scores inside it (an answer without
a positive image-token score has none and is left out of its mean); both have the box's share of the image tokens as
their random baseline. An image whose tokens are not one grid (LLaVA-NeXT's tiles, numbered tokens) is skipped with
the reason.

``faithfulness``. Removing an image token replaces what the decoder reads of it, the level the explanation is over
(not pixels: a pixel change would move every token the tower mixes it into), by the mean over the first image's
tokens: its embedding (the first block's input) and any vector the decoder adds to it between blocks (Qwen3-VL's
DeepStack features). The curves read the answer's probability, teacher-forced: the mean of its tokens'
probabilities. With the image tokens ranked by the answer's scores and ``steps + 1`` fractions ``f`` from 0 to 1,
``deletion_auc`` is the area under that probability as the top ``f`` is removed (lower is better), ``insertion_auc``
as the top ``f`` is put back into an image whose every token is removed (higher is better), and
``comprehensiveness_prob`` and ``sufficiency_prob`` ERASER's AOPC on the same curves, as for images
(:mod:`.vision`); random rankings (``random_draws`` per row, the same for every method) are the baseline.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from ..frontends.vision import checked_box
from ..frontends.vlm import GRID_CELL, cells_in_box
from ..runs.data import cell_value, image_paths, read_rows
from .explain import Explanation
from .items import EvaluationInputError, Item, Skipped
from .metrics import CURVE_METRICS, defined_mean, nan_mean, ranking_metrics
from .scores import Evaluation, MethodResult, score_methods

VLM_PROTOCOLS = ("pointing", "faithfulness")
METRICS = {"pointing": ("pointing_game", "gold_share"), "faithfulness": CURVE_METRICS}
DESCRIPTIONS = {
    "pointing": "Vision-language decoders: the answer explained as one span over the first image's tokens. "
    "pointing_game, 1 when the highest-scored image token is inside the gold box; gold_share, the share of the "
    "positive image-token scores inside it (higher is better for both); the box's share of the image tokens is the "
    "random baseline.",
    "faithfulness": "Vision-language decoders: the answer explained as one span over the first image's tokens, which "
    "are removed in the order of its scores (a removed token's embedding, and what the decoder adds to it between "
    "blocks, replaced by the image tokens' mean). deletion_auc, the area under the answer's probability (its tokens' "
    "mean, teacher-forced) as the top fraction is removed (lower is better); insertion_auc, as it is put back into an "
    "image with every token removed (higher is better); comprehensiveness_prob and sufficiency_prob, ERASER's AOPC "
    "on the same curves (higher and lower are better); random rankings are the baseline.",
}
#: Copies of a prompt per forward pass of the curves.
READ_BATCH = 8


def run_vlm(model, methods: list[str], data, protocol: str, found, settings) -> Evaluation:
    """A protocol on a vision-language decoder (the protocol registry's entry)."""
    from ..frontends import as_front_end

    front = as_front_end(model, methods[0], found, processor=settings.processor, device=settings.device)
    return evaluate_vlm(front, methods, data, protocol, method_kwargs=settings.method_kwargs, steps=settings.steps,
                        random_draws=settings.random_draws, draws=settings.draws, seed=settings.seed,
                        examples=settings.examples, show_progress=settings.show_progress,
                        columns=settings.columns)  # fmt: skip


def evaluate_vlm(front, methods: list[str], data, protocol: str = "pointing", *, method_kwargs: dict | None = None,
                 steps: int = 10, random_draws: int = 3, draws: int = 1000, seed: int = 0, examples: int = 2,
                 show_progress: bool = False, columns: dict[str, str] | None = None) -> Evaluation:  # fmt: skip
    """The pointing game or faithfulness by image tokens (see the module docstring).

    Args:
        front: The vision-language front end (:class:`~inseq_mixing.frontends.vlm.VisionLanguageAttributionModel`).
        methods: This package's method names.
        data: The rows.
        protocol: ``"pointing"`` or ``"faithfulness"``.
        method_kwargs: Per method, its options.
        steps: Fractions of the curves beyond 0 (faithfulness).
        random_draws: Random rankings per row (faithfulness).
        draws: Bootstrap resamples and permutations.
        seed: Seed of the resampling and of the random rankings.
        examples: Explanations kept per method for the report.
        show_progress: Show a progress bar over the methods.
        columns: Column names by role (``images``, ``prompt``, ``answer``, ``box``).

    Raises:
        EvaluationInputError: An unknown protocol, bad steps, or no row that can be evaluated.
    """
    if protocol not in VLM_PROTOCOLS:
        raise EvaluationInputError(f"Vision-language models take the protocols {VLM_PROTOCOLS}, not {protocol!r}.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise EvaluationInputError(f"steps must be an integer of at least 2, not {steps!r}.")
    rows, skipped = _read_rows(front, data, columns or {}, need_box=protocol == "pointing")
    if not rows:
        reasons = "; ".join(skip.reason for skip in skipped[:3])
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}.")
    evaluation = Evaluation(protocol, draws=draws, seed=seed, skipped=skipped)
    evaluation.metric_names = METRICS[protocol]
    evaluation.description = DESCRIPTIONS[protocol]
    method_kwargs = method_kwargs or {}
    per_row = {}
    readers = {}  # per row, its curves' reader: the same for every method

    def score(method: str):
        attribution = front.for_method(method)
        generator = torch.Generator().manual_seed(seed)  # the same random rankings for every method
        found, shown = [], []
        for row in rows:
            out = attribution.attribute(row["images"], row["prompt"], row["answer"], spans="answer",
                                        show_progress=False, **method_kwargs.get(method, {}))  # fmt: skip
            if protocol == "pointing":
                found.append(pointing(out, row["box"]))
            else:
                if row["row"] not in readers:
                    readers[row["row"]] = answer_reader(front, row["item"])
                found.append(curves(out, readers[row["row"]], steps, random_draws, generator))
            shown.append(Explanation(Item(row["row"], None, row["prompt"], row["answer"]),
                                     out.sequence_attributions[0], None, []))  # fmt: skip
        per_row[method] = found
        statistics = {metric: defined_mean([entry[metric] for entry in found]) for metric in evaluation.metrics}
        return MethodResult(statistics), shown

    score_methods(evaluation, list(methods), score, examples, show_progress)
    first = per_row[next(iter(evaluation.results))]
    evaluation.baseline = {metric: nan_mean([entry[f"random_{metric}"] for entry in first])
                           for metric in evaluation.metrics}  # fmt: skip
    return evaluation


def pointing(output, box) -> dict:
    """The pointing game and the gold share of one answer's scores over its first image's tokens (``box``: the gold
    box in that image's pixels)."""
    region, positions = box_tokens(output, box)
    scores = _answer_scores(output.sequence_attributions[0], positions)
    positive = scores.clamp(min=0)
    share = float(positive[region].sum() / positive.sum()) if positive.sum() > 0 else float("nan")
    chance = float(region.float().mean())
    return {"pointing_game": float(region[int(torch.argmax(scores))]), "gold_share": share,
            "random_pointing_game": chance, "random_gold_share": chance}  # fmt: skip


def box_tokens(output, box) -> tuple[torch.Tensor, list[int]]:
    """Which of the first image's tokens are in ``box`` (at least half of the token's cell), and their units' rows in
    the output's first sequence.

    Raises:
        ValueError: The image's tokens are not one grid.
    """
    sequence = output.sequence_attributions[0]
    cells = {index: GRID_CELL.match(token.token) for index, token in enumerate(sequence.source)}
    cells = {index: (int(found["row"]), int(found["column"])) for index, found in cells.items()
             if found and found["image"] == "1"}  # fmt: skip
    if not cells:
        raise ValueError("its first image's tokens are not one grid (tiles or numbered tokens): no cell to place.")
    inside = cells_in_box(list(cells.values()), output.info["image_boxes"][0][0], box)
    return torch.tensor(inside), list(cells)


def first_image_scores(sequence) -> torch.Tensor:
    """A sequence's scores of its answer (one span, units of tokens) over its first image's tokens, those labelled
    ``img1 ...``, in order."""
    return _answer_scores(sequence, [index for index, token in enumerate(sequence.source)
                                     if token.token.startswith("img1 ")])  # fmt: skip


def _answer_scores(sequence, positions: list[int]) -> torch.Tensor:
    """The answer's scores of the units at ``positions``, a map method's extra axis (layers, heads) averaged."""
    scores = sequence.source_attributions[positions, 0].float()
    return scores.mean(-1) if scores.ndim == 2 else scores


def compare_vlm(model, methods: list[str], inputs, targets, found, settings):
    """:func:`~inseq_mixing.compare` on a vision-language decoder: every method (the gradient baselines included, on
    the first decoder block's input) on the same prompts and answers (the model's greedy answers where none are
    given), each answer explained as one span; AOPC of the answer's probability with the first image's tokens removed
    (each read as the image tokens' mean, as the ``faithfulness`` protocol removes them), random rankings as the
    baseline, and the Spearman agreement of every two methods over those tokens. ``inputs``: an ``(images, prompt)``
    pair, or a list of them."""
    from ..frontends import as_front_end
    from .comparison import Comparison, each_method, fill_one_entry, with_explained
    from .faithfulness import removal_faithfulness

    front = as_front_end(model, methods[0], found, processor=settings.processor)
    pairs = [inputs] if isinstance(inputs, tuple) else list(inputs)
    if not pairs or not all(isinstance(pair, tuple | list) and len(pair) == 2 for pair in pairs):
        raise ValueError("compare on a vision-language model takes (images, prompt) pairs: one pair or a list.")
    answers = [targets] if isinstance(targets, str) else targets
    if answers is None:  # the greedy answers (generated, not explained), one generation forced for every method
        greedy = front.call_settings({}, spans="answer", max_new_tokens=settings.max_new_tokens or 20)
        answers = [front.tokenizer.decode(front.prepare([item], greedy).answers[0])
                   for item in front.items(pairs, None, None)]  # fmt: skip
    items = front.items(pairs, answers, None)
    readers = [answer_reader(front, item) for item in items]
    fractions, random_draws, method_kwargs = settings.fractions, settings.random_draws, settings.method_kwargs

    def attribute(method: str):
        options = with_explained(method, method_kwargs.get(method, {}), settings.attributed_fn)
        out = front.for_method(method).attribute([item.images for item in items], [item.prompt for item in items],
                                                 list(answers), spans="answer", show_progress=False,
                                                 **options)  # fmt: skip
        generator = torch.Generator().manual_seed(0)  # the same random rankings for every method
        rows = []
        for sequence, read in zip(out.sequence_attributions, readers, strict=True):
            scores = first_image_scores(sequence)
            rows.append(removal_faithfulness(read, scores, torch.ones(len(scores), dtype=torch.bool), fractions,
                                             random_draws, generator))  # fmt: skip
        return out, rows

    comparison = Comparison()
    done = each_method(methods, attribute, comparison.failed, "compare", settings.show_progress, "attributing",
                       stacklevel=4)  # fmt: skip
    return fill_one_entry(comparison, done, first_image_scores)


def curves(output, read, steps: int, random_draws: int, generator: torch.Generator) -> dict:
    """One answer's deletion and insertion curves over its first image's tokens, for its scores' ranking and for
    ``random_draws`` random rankings (``read``: :func:`answer_reader`)."""
    scores = first_image_scores(output.sequence_attributions[0])
    count = len(scores)
    result = ranking_metrics(read, torch.argsort(scores, descending=True, stable=True), count, steps)
    draws = [ranking_metrics(read, torch.randperm(count, generator=generator), count, steps)
             for _ in range(random_draws)]  # fmt: skip
    result.update({f"random_{key}": nan_mean([draw[key] for draw in draws]) for key in CURVE_METRICS})
    return result


def answer_reader(front, item):
    """For masks ``(n, K)`` of the first image's ``K`` tokens kept, the answer's probability (its tokens' mean,
    teacher-forced) and summed logit with the other tokens removed, each ``(n,)``: see the module docstring."""
    batch = front.prepare([item], front.call_settings({}, spans="answer"))
    call, spec = batch.request.caller(), front.spec
    rows = torch.tensor(batch.explained[0])
    answer = batch.request.predicted_ids[0].cpu()[rows]
    positions = torch.tensor(front.image_positions(item)[0][0])  # one prompt: no padding before it

    @torch.no_grad()
    def read(kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probabilities, logits = [], []
        for start in range(0, len(kept), READ_BATCH):
            removed = ~kept[start : start + READ_BATCH]
            copies = call.rows(torch.zeros(len(removed), dtype=torch.long, device=batch.request.attention_mask.device))
            with tokens_removed(spec, positions, removed):
                out = call.model(**copies).logits
            out = out[:, rows.to(out.device)].float().cpu()
            chosen = out.gather(-1, answer.expand(len(removed), -1)[..., None])[..., 0]
            probabilities.append(out.softmax(-1).gather(-1, answer.expand(len(removed), -1)[..., None])[..., 0]
                                 .mean(-1))  # fmt: skip
            logits.append(chosen.sum(-1))
        return torch.cat(probabilities), torch.cat(logits)

    return read


@contextmanager
def tokens_removed(spec, positions: torch.Tensor, removed: torch.Tensor):
    """Inside, copy ``c`` of a forward pass reads the image tokens at ``positions[removed[c]]`` as the mean over
    ``positions``: their first block's input, and what the decoder adds to them between its blocks
    (:class:`~inseq_mixing.specs.base.InjectedInputs`)."""

    def averaged(hidden: torch.Tensor) -> torch.Tensor:
        where = positions.to(hidden.device)
        mean = hidden[:, where].mean(1, keepdim=True)
        cut = torch.zeros(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
        cut[:, where] = removed.to(hidden.device)
        return torch.where(cut[..., None], mean, hidden)

    def first_block(_module, args, kwargs):
        if args:
            return (averaged(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": averaged(kwargs["hidden_states"])}

    def between_blocks(_module, args, kwargs):
        injected = spec.decoder.injected
        vectors, mask = kwargs.get(injected.vectors), kwargs.get(injected.mask)
        if vectors is None or mask is None:
            return None
        mask = mask.to(vectors[0].device)
        vectors = [averaged(injected.scattered(vector, mask))[mask] for vector in vectors]
        return args, {**kwargs, injected.vectors: vectors}

    with ExitStack() as hooks:
        first = spec.decoder.layers[0].module.register_forward_pre_hook(first_block, with_kwargs=True)
        hooks.callback(first.remove)
        if spec.decoder.injected is not None:
            added = spec.decoder.injected.module.register_forward_pre_hook(between_blocks, with_kwargs=True)
            hooks.callback(added.remove)
        yield


def _read_rows(front, data, columns: dict[str, str], need_box: bool) -> tuple[list[dict], list[Skipped]]:
    """The rows the front end takes (images read, prompt encoded, with ``need_box`` a box inside the first image),
    the others skipped with their reason."""
    names = {"images": "images", "prompt": "prompt", "answer": "answer"} | ({"box": "box"} if need_box else {})
    names.update({role: name for role, name in columns.items() if role in names and name})
    what = "the pointing game" if need_box else "faithfulness"
    rows, skipped = [], []
    for index, raw in enumerate(read_rows(data)):
        missing = [names[role] for role in names if role not in raw]
        if missing and index == 0:
            raise EvaluationInputError(f"The data has no column(s) {missing}: {what} reads {list(names.values())}.")
        name = f"Row {index}"
        try:
            images = list(image_paths(raw.get(names["images"]), index, str(index), names["images"]))
            prompt, answer = raw.get(names["prompt"]), raw.get(names["answer"])
            if not isinstance(answer, str) or not answer.strip():
                raise ValueError(f"{name} has no answer: {what} explains the phrase the row gives, teacher-forced.")
            item = front.prompt_item(name, images, prompt, answer, None)
            box = None
            if need_box:
                box = checked_box(cell_value(raw.get(names["box"])), item.images[0], f"{name}: the box",
                                  "the first image")  # fmt: skip
        except ValueError as error:
            skipped.append(Skipped(index, str(error)))
            continue
        rows.append({"row": index, "images": item.images, "prompt": prompt, "answer": answer, "box": box,
                     "item": item})  # fmt: skip
    return rows, skipped
