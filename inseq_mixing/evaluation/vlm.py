"""The pointing game on vision–language decoders (our extension: the methods' papers evaluate text and speech): does
the answer's explanation point into the image region the answer names?

Rows (JSONL, CSV, Parquet, a DataFrame or dicts): ``images`` (a path, or a JSON list of paths, one per placeholder of
the prompt), ``prompt``, ``answer`` (the phrase explained, teacher-forced: required, since the region is the
phrase's) and ``box`` (``[x0, y0, x1, y1]`` in the first image's own pixels, a list or its JSON). Each method
explains the answer as one span (``spans="answer"``: its summed logit, a map method's mean row) over the tokens; the
first image's tokens are the ranked items (the text's and the other images' are never ranked).

An image token is in the box when at least half of its cell is: its cell is its place on the token grid stretched
over the part of the image the grid covers (``info["image_boxes"]``: LLaVA's processor keeps the centred square,
Qwen2-VL's the whole image). ``pointing_game`` is 1 when the highest-scored image token is in the box (ties: the first
in reading order), ``gold_share`` the share of the positive image-token scores inside it (an answer without a
positive image-token score has none and is left out of its mean); both have the box's share of the image tokens as
their random baseline. An image whose tokens are not one grid (LLaVA-NeXT's tiles, numbered tokens) is skipped with
the reason.
"""

from __future__ import annotations

import torch

from ..frontends.vlm import GRID_CELL, cells_in_box
from ..runs.data import cell_value, image_paths, read_rows
from .explain import Explanation
from .items import EvaluationInputError, Item, Skipped
from .metrics import defined_mean, nan_mean
from .scores import Evaluation, MethodResult, score_methods

VLM_METRICS = ("pointing_game", "gold_share")
DESCRIPTION = (
    "Vision-language decoders: the answer explained as one span over the first image's tokens. pointing_game, 1 when "
    "the highest-scored image token is inside the gold box; gold_share, the share of the positive image-token scores "
    "inside it (higher is better for both); the box's share of the image tokens is the random baseline."
)


def run_vlm(model, methods: list[str], data, protocol: str, found, settings) -> Evaluation:
    """The pointing game on a vision-language decoder (the protocol registry's entry)."""
    from ..frontends import as_front_end

    front = as_front_end(model, methods[0], found, processor=settings.processor, device=settings.device)
    return evaluate_vlm(front, methods, data, method_kwargs=settings.method_kwargs, draws=settings.draws,
                        seed=settings.seed, examples=settings.examples, show_progress=settings.show_progress,
                        columns=settings.columns)  # fmt: skip


def evaluate_vlm(front, methods: list[str], data, *, method_kwargs: dict | None = None, draws: int = 1000,
                 seed: int = 0, examples: int = 2, show_progress: bool = False,
                 columns: dict[str, str] | None = None) -> Evaluation:  # fmt: skip
    """The pointing game (see the module docstring).

    Args:
        front: The vision-language front end (:class:`~inseq_mixing.frontends.vlm.VisionLanguageAttributionModel`).
        methods: This package's method names.
        data: The rows.
        method_kwargs: Per method, its options.
        draws: Bootstrap resamples and permutations.
        seed: Seed of the resampling.
        examples: Explanations kept per method for the report.
        show_progress: Show a progress bar over the methods.
        columns: Column names by role (``images``, ``prompt``, ``answer``, ``box``).

    Raises:
        EvaluationInputError: No row that can be evaluated.
    """
    rows, skipped = _read_rows(front, data, columns or {})
    if not rows:
        reasons = "; ".join(skip.reason for skip in skipped[:3])
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}.")
    evaluation = Evaluation("pointing", draws=draws, seed=seed, skipped=skipped)
    evaluation.metric_names = VLM_METRICS
    evaluation.description = DESCRIPTION
    method_kwargs = method_kwargs or {}
    per_row = {}

    def score(method: str):
        attribution = front.for_method(method)
        found, shown = [], []
        for row in rows:
            out = attribution.attribute(row["images"], row["prompt"], row["answer"], spans="answer",
                                        show_progress=False, **method_kwargs.get(method, {}))  # fmt: skip
            found.append(pointing(out, row["box"]))
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
    scores = output.sequence_attributions[0].source_attributions[positions, 0].float()
    scores = scores.mean(-1) if scores.ndim == 2 else scores
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


def _read_rows(front, data, columns: dict[str, str]) -> tuple[list[dict], list[Skipped]]:
    """The rows the front end takes (images read, prompt encoded, box inside the first image), the others skipped
    with their reason."""
    names = {"images": "images", "prompt": "prompt", "answer": "answer", "box": "box"}
    names.update({role: name for role, name in columns.items() if role in names and name})
    rows, skipped = [], []
    for index, raw in enumerate(read_rows(data)):
        missing = [names[role] for role in names if role not in raw]
        if missing and index == 0:
            raise EvaluationInputError(
                f"The data has no column(s) {missing}: the pointing game reads {list(names.values())}."
            )
        name = f"Row {index}"
        try:
            images = list(image_paths(raw.get(names["images"]), index, str(index), names["images"]))
            prompt, answer, box = raw.get(names["prompt"]), raw.get(names["answer"]), cell_value(raw.get(names["box"]))
            if not isinstance(answer, str) or not answer.strip():
                raise ValueError(f"{name} has no answer: the pointing game explains the phrase its box names.")
            item = front.prompt_item(name, images, prompt, answer, None)
            if not isinstance(box, list | tuple) or len(box) != 4:
                raise ValueError(f"{name}: a box is [x0, y0, x1, y1] in the first image's pixels, not {box!r}.")
            box = [float(value) for value in box]
            first = item.images[0]
            if not (0 <= box[0] < box[2] <= first.width and 0 <= box[1] < box[3] <= first.height):
                raise ValueError(f"{name}: the box {box} is not inside the {first.width} × {first.height} image.")
        except ValueError as error:
            skipped.append(Skipped(index, str(error)))
            continue
        rows.append({"row": index, "images": item.images, "prompt": prompt, "answer": answer, "box": box})
    return rows, skipped
