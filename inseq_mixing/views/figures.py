"""Matplotlib figures of per-layer context-mixing matrices (one panel per layer), as in the Value Zeroing paper."""

import base64
import io
import math

import matplotlib

matplotlib.use("Agg")  # figures are rendered to files and HTML, never to a window

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from .colours import colour_map  # noqa: E402


def layer_panels_grid(layers: int, panel: tuple[float, float], max_columns: int = 4, extra: tuple = (0.0, 0.0)):
    """The one layout of every per-layer figure: up to ``max_columns`` panels of ``panel`` inches per row, layer
    ``i`` (counted from 0, as ``info["score_axis"]`` and ``model.layers[i]``) in reading order and titled so, the
    panels left over switched off; ``extra`` inches for a colour bar and a caption.

    Returns:
        The figure and the ``layers`` axes, in layer order.
    """
    columns = min(max_columns, layers)
    rows = math.ceil(layers / columns)
    size = (panel[0] * columns + extra[0], panel[1] * rows + extra[1])
    figure, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
    flat = list(axes.flat)
    for index, axis in enumerate(flat):
        if index >= layers:
            axis.axis("off")
        else:
            axis.set_title(f"layer {index}", fontsize=9)
    return figure, flat[:layers]


def layer_figure(
    scores: torch.Tensor, row_tokens: list[str], column_tokens: list[str], title: str = "", max_columns: int = 4
):
    """One heatmap panel per layer.

    Args:
        scores: ``(rows, columns, layers)`` scores, e.g. Inseq's ``target_attributions`` of a per-layer method (rows:
            attributed tokens, columns: generated tokens). NaN cells are left blank.
        row_tokens: Labels of the rows.
        column_tokens: Labels of the columns.
        title: Figure title.
        max_columns: Panels per figure row.

    Returns:
        A matplotlib ``Figure``.
    """
    if scores.ndim != 3:
        raise ValueError(f"Expected (rows, columns, layers) scores, got shape {tuple(scores.shape)}.")
    panel = (2.2 + 0.28 * len(column_tokens), 1.6 + 0.28 * len(row_tokens))
    figure, axes = layer_panels_grid(scores.shape[-1], panel, max_columns)
    values = scores.float().nan_to_num(nan=float("nan")).numpy()
    finite = scores[torch.isfinite(scores)]
    vmax = float(finite.abs().max()) if finite.numel() else 1.0
    signed = bool((finite < -1e-6 * vmax).any()) if finite.numel() else False  # not float noise
    for layer, axis in enumerate(axes):
        image = axis.imshow(
            values[..., layer],
            cmap=colour_map(signed),
            vmin=-vmax if signed else 0.0,
            vmax=vmax,
            aspect="auto",
        )
        axis.set_xticks(range(len(column_tokens)), column_tokens, rotation=90, fontsize=7)
        axis.set_yticks(range(len(row_tokens)), row_tokens, fontsize=7)
    figure.colorbar(image, ax=axes, shrink=0.6)
    if title:
        figure.suptitle(title)
    return figure


def figure_png_base64(figure) -> str:
    """The figure as a base64 PNG (for self-contained HTML), closing it."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
