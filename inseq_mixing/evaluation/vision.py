"""The protocols on images (our extension: the methods' papers evaluate text and speech): faithfulness by patches
(deletion and insertion curves, AOPC) and the pointing game with the share of the scores inside a gold region.

Rows (JSONL, CSV, Parquet, a DataFrame or dicts): ``image`` (a path Pillow reads), optional ``label`` (the class
explained: a label name or index; default: the predicted label), and for ``pointing`` a gold region, ``box``
(``[x0, y0, x1, y1]`` in the image's own pixels, a list or its JSON) or ``patches`` (patch labels ``"r1c2"`` or
indices of the grid in reading order). An image classifier is explained (a classifier that reads [CLS], or a pooled
read-out); the ranked items are the patches only ([CLS], [DIST] and registers are never removed nor ranked).

``faithfulness``. Removing a patch replaces its pixels in the processed image (what the model reads, so a patch is
exactly a token) by the ``replacement``: ``"mean"``, the image's mean per channel, or ``"blur"``, the same pixels of
the image blurred (a Gaussian of radius one patch, drawn with Pillow on the image before the processor, so that the
processor's resizing and cropping apply to it alike). For the patches ranked by the explained label's scores
(averaged over an extra axis of layers or heads), with ``steps + 1`` fractions ``f`` from 0 to 1:

- ``deletion_auc``: area under the label's probability as the top ``f`` of the ranking is removed (most relevant
  first; lower is better), ``insertion_auc``: the same as the top ``f`` is put back into the image with every patch
  replaced (higher is better); the probabilities are the model's, not normalised by the original's (the original is
  the curve's first point). Deleting the least relevant first (LeRF) is not reported: at fraction ``f`` it keeps the
  top ``1 − f``, the image the insertion curve reads at ``1 − f``, so its area is ``insertion_auc``'s (the same curve
  read backwards);
- ``comprehensiveness_prob`` and ``sufficiency_prob``: ERASER's AOPC (as for text, :mod:`.faithfulness`) on the same
  curves: the mean drop of the probability from the original at the fractions strictly between 0 and 1, with the
  top removed, and with only the top kept.

Random rankings of the patches (``random_draws`` per image, the same for every method) are the baseline.

``pointing``: ``pointing_game`` is 1 when the highest-scored patch is in the gold region (ties: the first in reading
order), ``gold_share`` the share of the positive patch scores that falls inside it (maps are non-negative: all of
them; an image without a positive patch score has no gold share and is left out of its mean); both have the region's
share of the patches as their random baseline (a uniformly random patch, a uniform spread of the scores). A patch
is in a box when at least half its pixels are, after the processor's resizing and cropping (the box is drawn on an
image of the original's size and processed with it).

With ``random_baseline``, every method also runs on a randomly initialised copy of the model (a control: a method
whose scores hardly change reads the image, not the model).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..frontends.common import plain
from ..frontends.encoder_base import per_text
from ..frontends.vision import ImageError, checked_box, read_image
from ..runs.data import cell_value, read_rows
from .explain import Explanation
from .faithfulness import DEFAULT_FRACTIONS
from .items import EvaluationInputError, Item, Skipped
from .metrics import CURVE_METRICS as FAITHFULNESS_METRICS
from .metrics import defined_mean, nan_mean, ranking_metrics
from .scores import RANDOM_SUFFIX, Evaluation, MethodResult, random_copy, score_methods

VISION_PROTOCOLS = ("faithfulness", "pointing")
POINTING_METRICS = ("pointing_game", "gold_share")
REPLACEMENTS = ("mean", "blur")
#: What the metrics of each protocol mean (the report's words).
DESCRIPTIONS = {
    "faithfulness": "Image classifiers: patches ranked by the label's scores are replaced by {replacement} in the "
    "processed image. deletion_auc: area under the label's probability as the most relevant patches are removed "
    "(lower is better); insertion_auc: as they are put back into the image with every patch replaced (higher is "
    "better; deleting the least relevant first gives the same curve read backwards, so the same area: not "
    "repeated); comprehensiveness_prob and "
    "sufficiency_prob: ERASER's AOPC on the same curves (higher, and lower, is better). Random rankings of the "
    "patches are the baseline; '(random init)' marks a randomly initialised copy of the model.",
    "pointing": "Image classifiers: pointing_game, 1 when the highest-scored patch is inside the gold region; "
    "gold_share, the share of the positive patch scores inside it (higher is better for both); the region's share "
    "of the patches is the random baseline. '(random init)' marks a randomly initialised copy of the model.",
}
REPLACEMENT_WORDS = {"mean": "the image's mean colour", "blur": "the image blurred (one patch's radius)"}
#: Perturbed images read per forward pass.
READ_BATCH = 32


def evaluate_vision(
    front,
    methods: list[str],
    data,
    protocol: str,
    *,
    method_kwargs: dict | None = None,
    replacement: str = "mean",
    steps: int = 10,
    random_draws: int = 3,
    random_baseline: bool = False,
    draws: int = 1000,
    seed: int = 0,
    examples: int = 2,
    show_progress: bool = False,
    columns: dict[str, str] | None = None,
) -> Evaluation:
    """A protocol on an image classifier (see the module docstring).

    Args:
        front: The vision front end (:class:`~inseq_mixing.frontends.vision.VisionAttributionModel`) of a classifier.
        methods: This package's method names (and the gradient baselines).
        data: The rows.
        protocol: ``"faithfulness"`` or ``"pointing"``.
        method_kwargs: Per method, its options.
        replacement: ``"mean"`` or ``"blur"`` (faithfulness).
        steps: Fractions of the curves beyond 0 (faithfulness).
        random_draws: Random rankings per image (faithfulness).
        random_baseline: Also run every method on a randomly initialised copy of the model.
        draws: Bootstrap resamples and permutations.
        seed: Seed of the resampling, of the random rankings and of the random copy.
        examples: Explanations kept per method for the report.
        show_progress: Show a progress bar over the methods.
        columns: Column names by role (``image``, ``label``, ``box``, ``patches``).

    Raises:
        EvaluationInputError: Not a classifier, an unknown protocol or replacement, or no row that can be evaluated.
    """
    if protocol not in VISION_PROTOCOLS:
        raise EvaluationInputError(f"Image models take the protocols {VISION_PROTOCOLS}, not {protocol!r}.")
    if replacement not in REPLACEMENTS:
        raise EvaluationInputError(f"replacement must be one of {REPLACEMENTS}, not {replacement!r}.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise EvaluationInputError(f"steps must be an integer of at least 2, not {steps!r}.")
    if front.task is None or front.similarity:
        raise EvaluationInputError(
            f"The image protocols explain a classifier's label, and {type(front.model).__name__} is "
            f"{'an image–text model' if front.similarity else 'a bare encoder'}: load an image classifier "
            "(...ForImageClassification)."
        )
    rows, skipped = _read_rows(front, data, columns or {}, protocol == "pointing")
    if not rows:
        reasons = "; ".join(skip.reason for skip in skipped[:3])
        raise EvaluationInputError(f"No row of the data can be evaluated: {reasons}.")
    evaluation = Evaluation(protocol, draws=draws, seed=seed, skipped=skipped)
    evaluation.metric_names = FAITHFULNESS_METRICS if protocol == "faithfulness" else POINTING_METRICS
    evaluation.description = DESCRIPTIONS[protocol].format(replacement=REPLACEMENT_WORDS[replacement])
    method_kwargs = method_kwargs or {}
    copies = {"": front.model}
    if random_baseline:
        copies[RANDOM_SUFFIX] = random_copy(front.model, seed)
    per_image = {}

    def score(name: str):
        suffix = RANDOM_SUFFIX if name.endswith(RANDOM_SUFFIX) else ""
        method = name.removesuffix(suffix)
        attribution = type(front)(copies[suffix], front.processor, method)
        sequences = [
            attribution.attribute(row["image"], row["label"], show_progress=False, **method_kwargs.get(method, {}))
            .sequence_attributions[0]
            for row in rows
        ]  # fmt: skip
        if protocol == "faithfulness":
            generator = torch.Generator().manual_seed(seed)  # the same random rankings for every method
            found = [_curves(attribution, row, sequence, replacement, steps, random_draws, generator)
                     for row, sequence in zip(rows, sequences, strict=True)]  # fmt: skip
        else:
            found = [pointing(attribution, row, sequence) for row, sequence in zip(rows, sequences, strict=True)]
        per_image[name] = found
        statistics = {metric: defined_mean([image[metric] for image in found]) for metric in evaluation.metrics}
        shown = [Explanation(Item(row["row"], None, row["name"], sequence.target[0].token), sequence, None, [],
                             row["image"]) for row, sequence in zip(rows, sequences, strict=True)]  # fmt: skip
        return MethodResult(statistics), shown

    names = [f"{method}{suffix}" for suffix in copies for method in methods]
    score_methods(evaluation, names, score, examples, show_progress)
    first = per_image[next(iter(evaluation.results))]
    evaluation.baseline = {metric: nan_mean([image[f"random_{metric}"] for image in first])
                           for metric in evaluation.metrics}  # fmt: skip
    return evaluation


# ----- rows -----


def _read_rows(front, data, columns: dict[str, str], need_region: bool) -> tuple[list[dict], list[Skipped]]:
    """The rows whose image (and, for ``pointing``, gold region) the front end takes, and the others skipped with
    their reason. A row: ``row``, ``name``, ``image`` (RGB PIL image), ``label``, ``region`` (bool patch mask, or
    None)."""
    names = {"image": "image", "label": "label", "box": "box", "patches": "patches"}
    names.update({role: name for role, name in columns.items() if role in names and name})
    rows, skipped = [], []
    for index, raw in enumerate(read_rows(data)):
        name, value = f"Row {index}", raw.get(names["image"])
        if value is None or (isinstance(value, str) and not value.strip()):
            if index == 0 and names["image"] not in raw:
                raise EvaluationInputError(f"The data has no column {names['image']!r}.")
            skipped.append(Skipped(index, "missing image"))
            continue
        label = raw.get(names["label"])
        if names["label"] in raw and not _given(label):  # an empty cell of a label column: not the prediction
            skipped.append(Skipped(index, f"{name} has no label: give one, or leave the column {names['label']!r} "
                                          "out to explain the model's predictions"))  # fmt: skip
            continue
        label = label if _given(label) else None
        try:
            image = read_image(value, name)  # a path (or, from Python, a PIL image or an array)
            front.validate([image], [label], names=[name])
            region = gold_region(front, image, raw.get(names["box"]), raw.get(names["patches"]), name)
            if need_region and region is None:
                raise ValueError(f"{name} has no gold region: give a box [x0, y0, x1, y1] or patches.")
        except (ImageError, ValueError) as error:
            skipped.append(Skipped(index, str(error)))
            continue
        shown = str(value) if isinstance(value, str | Path) else name
        rows.append({"row": index, "name": shown, "image": image, "label": label, "region": region})
    return rows, skipped


def gold_region(front, image, box, patches, name: str) -> torch.Tensor | None:
    """The gold region as a bool mask over the image's patches (reading order), or None without one."""
    box, patches = cell_value(box), cell_value(patches)  # a CSV cell as a JSONL row gives it
    patches = [cell_value(value) for value in patches] if isinstance(patches, list) else patches
    inputs, _, (grid,) = front.encode([image])
    if _given(patches):
        labels = [f"r{row}c{column}" for row in range(grid[0]) for column in range(grid[1])]
        values = patches if isinstance(patches, list | tuple) else [patches]
        mask = torch.zeros(len(labels), dtype=torch.bool)
        for value in values:
            position = labels.index(value) if value in labels else value
            if isinstance(position, str) or not 0 <= int(position) < len(labels):
                raise ValueError(f"{name}: {value!r} is not a patch of the {grid[0]} × {grid[1]} grid.")
            mask[int(position)] = True
        return mask
    if not _given(box):
        return None
    x0, y0, x1, y1 = checked_box(box, image, f"{name}: the box")
    from PIL import Image, ImageDraw

    drawn = Image.new("RGB", image.size)
    ImageDraw.Draw(drawn).rectangle([x0, y0, x1 - 1, y1 - 1], fill=(255, 255, 255))
    blank = front.encode([Image.new("RGB", image.size)])[0]
    share = front.patch_shares(front.encode([drawn])[0], blank, grid)  # the processor's geometry
    mask = (share >= 0.5).cpu()
    if not mask.any():
        raise ValueError(f"{name}: the box {box} covers less than half of every patch once processed.")
    return mask


def _given(value) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and value != ""


# ----- faithfulness -----


def _curves(front, row: dict, sequence, replacement: str, steps: int, random_draws: int, generator) -> dict:
    """One image's curves and AOPC for the method's ranking and for ``random_draws`` random rankings."""
    inputs, _, (grid,) = front.encode([row["image"]])
    scores = _patch_scores(sequence, len(front.leading), grid)
    label = explained_label(front, inputs, row["label"])
    read = patch_reader(front, inputs, _replacement(front, row["image"], inputs, grid, replacement), grid, label)
    patches = grid[0] * grid[1]
    result = ranking_metrics(read, torch.argsort(scores, descending=True, stable=True), patches, steps)
    draws = [ranking_metrics(read, torch.randperm(patches, generator=generator), patches, steps)
             for _ in range(random_draws)]  # fmt: skip
    result.update({f"random_{key}": nan_mean([draw[key] for draw in draws]) for key in FAITHFULNESS_METRICS})
    return result


def explained_label(front, inputs: dict, label) -> int:
    """The label whose probability an image's curves read: the row's label (a name or an index), or the model's
    prediction, whatever the method (a map method's explained entry is [CLS], whose id is its position, not a
    label; a label in a list of one is the label)."""
    if isinstance(label, list | tuple) and len(label) == 1:
        label = label[0]
    if label is not None:
        return front.output_index(label)
    with torch.no_grad():
        return int(front.model(**inputs).logits[0].float().argmax())


def _replacement(front, image, inputs: dict, grid: tuple[int, int], replacement: str) -> dict:
    """What a removed patch's pixels become: the image's mean colour, or the image blurred (its inputs)."""
    if replacement == "mean":
        return front.mean_colour(inputs)
    from PIL import ImageFilter

    radius = image.width / grid[1]  # one patch's width, in the image's own pixels
    return front.encode([image.filter(ImageFilter.GaussianBlur(radius))])[0]


def patch_reader(front, inputs: dict, replaced: dict, grid: tuple[int, int], label: int, foil: int | None = None):
    """The label's probability and logit (minus the foil's) for masks ``(n, patches)`` of the patches kept (the
    others taken from ``replaced``)."""

    @torch.no_grad()
    def read(kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probabilities, logits = [], []
        for start in range(0, len(kept), READ_BATCH):
            perturbed = front.replaced(inputs, replaced, kept[start : start + READ_BATCH], grid)
            out = front.model(**perturbed).logits.float()
            probabilities.append(out.softmax(-1)[:, label].cpu())
            logits.append((out[:, label] - (0 if foil is None else out[:, foil])).cpu())
        return torch.cat(probabilities), torch.cat(logits)

    return read


# ----- pointing -----


def pointing(front, row: dict, sequence) -> dict:
    """The pointing game and the gold share of one image's patch scores."""
    region = row["region"]
    scores = _patch_scores(sequence, len(front.leading), (len(region), 1))
    positive = scores.clamp(min=0)
    share = float(positive[region].sum() / positive.sum()) if positive.sum() > 0 else float("nan")
    chance = float(region.float().mean())
    return {
        "pointing_game": float(region[int(torch.argmax(scores))]),
        "gold_share": share,
        "random_pointing_game": chance,
        "random_gold_share": chance,
    }


# ----- compare -----


def compare_vision(model, methods: list[str], images, targets, found, settings):
    """:func:`~inseq_mixing.compare` on an image classifier: each method (the gradient baselines included) on the
    same images, each image's label scored by AOPC with its patches replaced by the image's mean colour (the top
    ``k%`` removed, or only they kept; [CLS] and the like never), random rankings as the baseline, and the Spearman
    agreement of every two methods over the patches."""
    from ..frontends import as_front_end, load_model
    from .comparison import Comparison, each_method, fill_one_entry, with_explained

    front = as_front_end(model, methods[0], found, processor=settings.processor)
    images = list(images) if isinstance(images, list | tuple) else [images]
    targets = targets if isinstance(targets, list | tuple) or targets is None else [targets]
    fractions, random_draws, method_kwargs = settings.fractions, settings.random_draws, settings.method_kwargs
    show_progress, attributed_fn = settings.show_progress, settings.attributed_fn
    if front.task is None or front.similarity:
        raise ValueError("compare on images scores a classifier's label: load an image classifier.")
    comparison = Comparison(images=[read_image(image, f"Image {index}") for index, image in enumerate(images)])
    lead = len(front.leading)

    labels = per_text(plain(targets), len(images), "targets")

    def attribute(method: str):
        attribution = load_model(front, method)  # the same model and processor, with this method
        options = with_explained(method, method_kwargs.get(method, {}), attributed_fn)
        out = attribution.attribute(images, targets, show_progress=False, **options)
        explained = list(zip(comparison.images, out.sequence_attributions, labels, strict=True))
        return out, image_faithfulness(front, explained, fractions, random_draws)

    done = each_method(methods, attribute, comparison.failed, "compare", show_progress, "attributing", stacklevel=4)
    return fill_one_entry(comparison, done, lambda sequence: _patch_scores(sequence, lead))


def image_faithfulness(front, explained: list, fractions, random_draws: int, seed: int = 0) -> list[dict]:
    """ERASER's AOPC of each image's label (its patches replaced by the image's mean colour: the top ``k%`` removed,
    or only they kept; [CLS] and the like never), with ``random_draws`` random rankings (the same for every method,
    from ``seed``): one row per ``(image, sequence, label)`` of ``explained`` (the label: a name, an index, or None
    for the model's prediction; :func:`explained_label`), with :func:`.faithfulness.removal_faithfulness`'s keys.
    What ``compare`` and a stored run's evaluation score on images."""
    from .faithfulness import removal_faithfulness

    generator = torch.Generator().manual_seed(seed)
    lead = len(front.leading)
    rows = []
    for image, sequence, label in explained:
        inputs, _, (grid,) = front.encode([image])
        read = patch_reader(front, inputs, front.mean_colour(inputs), grid, explained_label(front, inputs, label))
        scores = _patch_scores(sequence, lead, grid)
        candidates = torch.arange(len(scores) + lead) >= lead

        def read_patches(kept, read=read):  # the leading tokens are never removed
            return read(kept[:, lead:])

        every = torch.cat([torch.zeros(lead), scores])
        rows.append(removal_faithfulness(read_patches, every, candidates, fractions, random_draws, generator))
    return rows


def _patch_scores(sequence, lead: int, grid: tuple[int, int] | None = None) -> torch.Tensor:
    """The explained entry's scores of the patches (an extra axis averaged; ``grid``: the image's, so that a padded
    image's scores stop at its last patch)."""
    scores = sequence.source_attributions[:, 0].float()
    scores = (scores.mean(-1) if scores.ndim == 2 else scores)[lead:]
    return scores if grid is None else scores[: grid[0] * grid[1]]


def run_vision(model, methods: list[str], data, protocol: str, found, settings) -> Evaluation:
    """An image protocol (the protocol registry's entry: :func:`evaluate_vision`)."""
    from ..frontends import as_front_end

    front = as_front_end(model, methods[0], found, processor=settings.processor, device=settings.device)
    return evaluate_vision(front, methods, data, protocol, method_kwargs=settings.method_kwargs,
                           replacement=settings.replacement, steps=settings.steps, random_draws=settings.random_draws,
                           random_baseline=settings.random_baseline, draws=settings.draws, seed=settings.seed,
                           examples=settings.examples, show_progress=settings.show_progress,
                           columns=settings.columns)  # fmt: skip


def stored_faithfulness(front, run, ids, sequences, random_draws: int, seed: int, show_progress: bool):
    """A stored image run's faithfulness: each image read again from the file its row names, its label's AOPC by
    patches (:func:`image_faithfulness`); the images go to the report."""
    explained = [(_stored_image(run, example_id), sequence, _stored_label(front, run, example_id))
                 for example_id, sequence in zip(ids, sequences, strict=True)]  # fmt: skip
    images = [image for image, *_ in explained]
    return image_faithfulness(front, explained, DEFAULT_FRACTIONS, random_draws, seed), images


def _stored_image(run, example_id: str):
    """An image example, read again from the file its row names."""
    from ..frontends.vision import ImageError, read_image

    path = run.inputs(example_id)["source_text"]
    try:
        return read_image(path, f"Example {example_id!r}")
    except ImageError as error:
        raise EvaluationInputError(
            f"{error} The faithfulness of an image run reads its image files again: evaluate it where they are (the "
            "paths are the run's data's, relative ones from the folder the run was made in)."
        ) from None


def _stored_label(front, run, example_id: str):
    """The label an image example's scores are read for: the stored target when it is one of the model's labels (the
    row's, or a logit method's prediction), else None, the model's prediction (a map method stores the explained
    token, [CLS])."""
    text = run.inputs(example_id)["target_text"]
    try:
        front.output_index(text)
    except (ValueError, TypeError):
        return None
    return text
