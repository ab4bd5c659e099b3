"""Patch scores drawn over the image: one heatmap per explained entry, one small map per layer, and a page of them.

A vision sequence's source tokens are ``[CLS]`` (DeiT: and ``[DIST]``) then one per patch labelled ``r{row}c{column}``
(:mod:`inseq_mixing.frontends.vision`); the patches' scores are laid out on their grid and stretched over the whole
image (the ViT and DeiT processors resize the image without cropping, so the grid covers it all). The leading tokens'
scores are written in the caption, since they have no place on the image. Signed scores (the logit methods) use a
diverging scale centred on 0 (red raises the explained logit, blue lowers it); maps (how much each token mixes into
the explained one) a sequential one from 0. The caption says which.
"""

from __future__ import annotations

import re

import numpy as np

from .colours import colour_map, scale_name
from .figures import figure_png_base64, layer_panels_grid, plt

#: A patch token's label, ``r{row}c{column}`` (what the vision front end names its patches), or an image token's on
#: its grid, ``img{image} r{row}c{column}`` (the vision-language front end's, for an image in one run of tokens).
PATCH_LABEL = re.compile(r"^(?:img(?P<image>\d+) )?r(?P<row>\d+)c(?P<column>\d+)$")


def patch_grid(sequence, entry: int = 0, layer: int | None = None,
               image_number: int = 1) -> tuple[np.ndarray, dict[str, float]]:  # fmt: skip
    """The patches' scores for one explained entry as a ``(rows, columns)`` grid, and the other tokens' scores.

    Args:
        sequence: A vision sequence (Inseq's ``FeatureAttributionSequenceOutput``), or a vision-language one.
        entry: Which explained entry (column of ``source_attributions``).
        layer: Per-layer outputs: which layer (default: the last).
        image_number: A vision-language sequence: which of its images (``img{image_number}``, from 1); the other
            images' tokens and the text's are left out (not among the other tokens).
    """
    scores = sequence.source_attributions
    if scores is None:
        raise ValueError("This sequence has no source scores to draw.")
    column = scores[:, entry]
    if column.dim() == 2:
        column = column[:, -1 if layer is None else layer]
    return _on_grid([token.token for token in sequence.source], column.float().tolist(), image_number)


def tower_grid(output, sequence: int = 0, entry: int = 0, image_number: int = 1) -> tuple[np.ndarray, dict]:
    """A vision-language output's scores continued through the vision tower (``attribute(..., tower=True)``) for one
    explained entry and one image, as a ``(rows, columns)`` grid of the tower's patches, and the other tower tokens'
    scores (``[CLS]``).

    Raises:
        ValueError: The output has no tower scores for that image, or the tower read the image in tiles (InternVL,
            LLaVA-NeXT: its tower tokens are not one grid).
    """
    found = output.sequence_attributions[sequence].sequence_scores or {}
    scores = found.get(f"tower_image{image_number}")
    if scores is None:
        raise ValueError(f"Sequence {sequence} has no tower scores for image {image_number}: call attribute(..., "
                         "tower=True).")  # fmt: skip
    labels = (output.info or {}).get("tower_tokens") or []
    if labels and isinstance(labels[0], list):  # images of their own sizes: per prompt, per image
        labels = labels[sequence][image_number - 1]
    if len(labels) != len(scores):
        raise ValueError(f"Image {image_number}'s tower read it in {len(scores) // max(len(labels), 1)} tiles, whose "
                         "patches are not one grid: draw its image tokens (tower=False).")  # fmt: skip
    return _on_grid(labels, scores[:, entry].float().tolist(), image_number=1)


def _on_grid(labels: list[str], values: list[float], image_number: int) -> tuple[np.ndarray, dict[str, float]]:
    """Scores of tokens labelled ``r{row}c{column}`` (or ``img{n} r{row}c{column}``, image ``image_number``'s) on
    their grid, and the other tokens' (where no token names an image)."""
    cells, others = {}, {}
    several = any(label.startswith("img") for label in labels)
    for label, value in zip(labels, values, strict=True):
        found = PATCH_LABEL.match(label)
        if found and (found["image"] is None or int(found["image"]) == image_number):
            cells[(int(found["row"]), int(found["column"]))] = value
        elif not several:
            others[label] = value
    if not cells:
        raise ValueError(
            "No patch tokens (r{row}c{column}, or img{image} r{row}c{column} on one grid) in this sequence: it is not "
            "a vision model's output, or its image's tokens are not on one grid (tiles, numbered tokens)."
        )
    rows, columns = (max(index[axis] for index in cells) + 1 for axis in (0, 1))
    grid = np.full((rows, columns), np.nan)
    for (row, col), value in cells.items():
        grid[row, col] = value
    return grid, others


def _scale(values: np.ndarray, signed: bool | None) -> tuple[str, float, float, bool]:
    finite = values[np.isfinite(values)]
    signed = bool((finite < 0).any()) if signed is None else signed
    top = float(np.abs(finite).max()) if finite.size else 1.0
    top = top or 1.0
    return (colour_map(True), -top, top, True) if signed else (colour_map(False), 0.0, top, False)


def _entry_scale(sequence, entry: int, layer: int | None, signed: bool | None, image_number: int = 1,
                 drawn: tuple | None = None):  # fmt: skip
    """One entry's patch grid (``drawn``, a grid and other scores, where given), its other tokens' scores, and the
    colour scale drawn for both (cmap, low, high, signed): what :func:`image_heatmap` draws and a caption of it
    says."""
    grid, others = patch_grid(sequence, entry, layer, image_number) if drawn is None else drawn
    return grid, others, _scale(np.concatenate([grid.ravel(), list(others.values())]), signed)


def _caption(signed: bool) -> str:
    if signed:
        return f"contribution to the explained logit ({scale_name(True)})"
    return f"context mixing into the explained token ({scale_name(False)})"


def image_heatmap(sequence, image, *, entry: int = 0, layer: int | None = None, signed: bool | None = None,
                  path=None, title: str | None = None, alpha: float = 0.55, method: str | None = None,
                  image_number: int = 1, box=None, drawn: tuple | None = None):  # fmt: skip
    """The patches' scores over ``image`` for one explained entry.

    Args:
        sequence: A vision sequence (one of ``out.sequence_attributions``), or a vision-language one
            (:func:`answer_heatmap` reads its image's place for it).
        image: The image it explains: a path, a PIL image, an array or a tensor.
        entry: Which explained entry.
        image_number: A vision-language sequence: which of its images (from 1).
        box: The part of the image the grid covers, ``(left, top, right, bottom)`` in its pixels (default: the whole
            image; a vision-language output's ``info["image_boxes"]``).
        layer: Per-layer outputs: which layer (default: the last).
        signed: Draw on a diverging scale (default: when some score is negative).
        path: Also save the figure there (PNG, or any format matplotlib writes).
        title: Figure title (default: the method, when given, and the explained entry).
        method: The method's name, for the default title (a sequence does not carry it; the output's
            ``info["attribution_method"]`` does).
        alpha: Opacity of the scores over the image.
        drawn: The grid to draw and the other tokens' scores, in place of the sequence's own patch scores (the tower's
            patches: :func:`tower_grid`).

    Returns:
        A matplotlib ``Figure``.
    """
    from ..frontends.vision import read_image

    picture = np.asarray(read_image(image, "The image"))
    grid, others, (cmap, low, high, signed) = _entry_scale(sequence, entry, layer, signed, image_number, drawn)
    figure, axis = plt.subplots(figsize=(5.2, 4.6))
    height, width = picture.shape[:2]
    left, top, right, bottom = (0, 0, width, height) if box is None else box
    axis.imshow(picture)
    shown = axis.imshow(grid, cmap=cmap, vmin=low, vmax=high, alpha=alpha, extent=(left, right, bottom, top),
                        interpolation="nearest")  # fmt: skip
    axis.set_xlim(min(0, left), max(width, right))
    axis.set_ylim(max(height, bottom), min(0, top))
    axis.set_xticks([])
    axis.set_yticks([])
    explained = sequence.target[entry].token if sequence.target else str(entry)
    default = (
        (f"{method}, " if method else "") + f"explained: {explained}" + ("" if layer is None else f" (layer {layer})")
    )
    axis.set_title(title or default, fontsize=10)
    bar = figure.colorbar(shown, ax=axis, fraction=0.046, pad=0.04)
    bar.set_label(_caption(signed), fontsize=8)
    if others:
        axis.set_xlabel(", ".join(f"{name}: {value:.3g}" for name, value in others.items()), fontsize=8)
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=120)
    return figure


def answer_heatmap(output, images, *, sequence: int = 0, entry: int = 0, image_number: int = 1, path=None,
                   tower: bool = False, **options):  # fmt: skip
    """A vision-language output's image-token scores for one explained entry (a generated token, or the answer) over
    the image, on the part of it the tokens' grid covers (``info["image_boxes"]``: LLaVA's processor keeps the
    centred square, Qwen2-VL's the whole image): :func:`image_heatmap` for that output; with ``tower=True``, the
    scores continued through the vision tower onto its patches instead (:func:`tower_grid`: a finer grid over the
    same part of the image; ``[CLS]``'s score in the caption).

    Args:
        output: The output of a vision-language model's ``attribute``.
        images: The images of ``sequence``'s prompt (one, or the list given to ``attribute``).
        sequence: Which prompt.
        entry: Which explained entry (a generated token; 0 with ``spans="answer"``).
        image_number: Which image of the prompt (from 1).
        path: Also save the figure there.
        tower: Draw the tower's patches (the output of ``attribute(..., tower=True)``).
        options: Further arguments of :func:`image_heatmap` (``signed``, ``title``, ``alpha``, ``layer``).

    Returns:
        A matplotlib ``Figure``.
    """
    boxes = (output.info or {}).get("image_boxes")
    if boxes is None:
        raise ValueError("This output has no image_boxes in its info: it is not a vision-language model's output.")
    listed = list(images) if isinstance(images, list | tuple) else [images]
    if not 1 <= image_number <= len(boxes[sequence]) or len(listed) != len(boxes[sequence]):
        raise ValueError(f"Sequence {sequence} explains {len(boxes[sequence])} image(s): give them all, and an "
                         f"image_number from 1 to {len(boxes[sequence])}, not {image_number}.")  # fmt: skip
    drawn = tower_grid(output, sequence, entry, image_number) if tower else None
    return image_heatmap(output.sequence_attributions[sequence], listed[image_number - 1], entry=entry, path=path,
                         method=output.info.get("attribution_method"), image_number=image_number,
                         box=boxes[sequence][image_number - 1], drawn=drawn, **options)  # fmt: skip


def layer_image_grid(sequence, image, *, entry: int = 0, signed: bool | None = None, path=None,
                     max_columns: int = 4, alpha: float = 0.55):  # fmt: skip
    """One small map over ``image`` per layer (a per-layer output: ``source_attributions`` with a layer axis), all
    on one colour scale, layers counted from 0.

    Returns:
        A matplotlib ``Figure``.
    """
    from ..frontends.vision import read_image

    scores = sequence.source_attributions
    if scores is None or scores.dim() != 3:
        raise ValueError("This output has no layer axis: ask the method for per-layer maps (per_layer=True).")
    picture = np.asarray(read_image(image, "The image"))
    layers = scores.shape[-1]
    grids = [patch_grid(sequence, entry, layer)[0] for layer in range(layers)]
    cmap, low, high, signed = _scale(np.stack(grids), signed)
    figure, axes = layer_panels_grid(layers, (2.4, 2.4), max_columns, extra=(0.8, 0.6))
    height, width = picture.shape[:2]
    shown = None
    for index, axis in enumerate(axes):
        axis.set_xticks([])
        axis.set_yticks([])
        axis.imshow(picture)
        shown = axis.imshow(grids[index], cmap=cmap, vmin=low, vmax=high, alpha=alpha, extent=(0, width, height, 0),
                            interpolation="nearest")  # fmt: skip
    figure.colorbar(shown, ax=axes, fraction=0.03, pad=0.02)
    explained = sequence.target[entry].token if sequence.target else str(entry)
    figure.text(0.02, 0.02, f"explained: {explained}; colour: {_caption(signed)}", fontsize=8)
    if path is not None:
        figure.savefig(path, dpi=120)
    return figure


def image_report(output, images, path, title: str = "Context mixing over image patches") -> str:
    """A self-contained HTML page of a vision output: per image, its heatmap over the image for every explained entry
    and, for a per-layer output, the grid of layers, each with its colour scale said in words.

    Args:
        output: The ``FeatureAttributionOutput`` of a vision model's ``attribute``.
        images: The images it explains, in the same order (paths, PIL images, arrays or tensors).
        path: Where to write the page (None: only return it).
        title: The page's title.

    Returns:
        The page's HTML.
    """
    import html
    from pathlib import Path

    sequences = output.sequence_attributions
    images = list(images) if isinstance(images, list | tuple) else [images]
    if len(images) != len(sequences):
        raise ValueError(f"The output explains {len(sequences)} image(s), but {len(images)} were given.")
    method = (output.info or {}).get("attribution_method", "")
    sections = []
    for number, (sequence, image) in enumerate(zip(sequences, images, strict=True)):
        name = html.escape(str(image) if isinstance(image, str | Path) else f"image {number}")
        sections.append(f"<section><h2>{name}</h2>{image_figures(sequence, image, name, method)}</section>")
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>"
        "body{{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em}}"
        "figure{{display:inline-block;margin:0 1em 1em 0;max-width:100%}} img{{max-width:100%;height:auto}}"
        "figcaption{{font-size:0.9em;max-width:36em}}</style></head><body><h1>{title}</h1><p>Method: {method}. "
        "Explained: {explained}. "
        "Each patch's score is drawn over its place in the image; tokens without a place ([CLS], [DIST], registers) "
        "are written under each map.</p>{sections}</body></html>"
    ).format(
        title=html.escape(title),
        method=html.escape(method),
        sections="".join(sections),
        explained=html.escape((output.info or {}).get("explained", "each image's explained entries")),
    )
    if path is not None:
        Path(path).write_text(page, encoding="utf-8")
    return page


def overlay_files(output, images, folder) -> list:
    """Each image's heatmap over it (its first explained entry, the method named in the title) written as a PNG in
    ``folder``: what ``out.show()`` of a vision output gives outside a notebook. Returns the paths."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    method = (output.info or {}).get("attribution_method")
    paths = []
    for number, (sequence, image) in enumerate(zip(output.sequence_attributions, images, strict=True)):
        path = folder / f"image_{number}.png"
        plt.close(image_heatmap(sequence, image, path=path, method=method))
        paths.append(path)
    return paths


def image_figures(sequence, image, name: str, method: str | None = None) -> str:
    """HTML figures of one image's sequence: its heatmap over the image for every explained entry and, for a
    per-layer output, the grid of layers, each captioned with its colour scale in words (``name``: HTML-escaped;
    ``method``: named in each figure's title)."""
    import html

    figures = []
    for entry in range(len(sequence.target)):
        figure = image_heatmap(sequence, image, entry=entry, method=method)
        signed = _entry_scale(sequence, entry, None, None)[2][3]  # the scale the figure was drawn on
        figures.append(_figure_html(figure_png_base64(figure), f"{name}, explained: "
                                    f"{html.escape(sequence.target[entry].token)}", _caption(signed)))  # fmt: skip
    if sequence.source_attributions.dim() == 3:
        figure = layer_image_grid(sequence, image)
        figures.append(_figure_html(figure_png_base64(figure), f"{name}, layer by layer (from layer 0)",
                                    "one colour scale for every layer"))  # fmt: skip
    return "".join(figures)


def _figure_html(png: str, alt: str, caption: str) -> str:
    return (f"<figure><img alt='{alt}' src='data:image/png;base64,{png}'><figcaption>{alt}. Colour: {caption}."
            "</figcaption></figure>")  # fmt: skip
