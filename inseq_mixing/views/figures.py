"""Matplotlib figures of per-layer context-mixing matrices (one panel per layer), as in the Value Zeroing paper."""

import base64
import io
import math

import matplotlib

matplotlib.use("Agg")  # figures are rendered to files and HTML, never to a window

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


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
    num_layers = scores.shape[-1]
    columns = min(max_columns, num_layers)
    rows = math.ceil(num_layers / columns)
    size = (2.2 + 0.28 * len(column_tokens), 1.6 + 0.28 * len(row_tokens))
    figure, axes = plt.subplots(rows, columns, figsize=(size[0] * columns, size[1] * rows), squeeze=False)
    values = scores.float().nan_to_num(nan=float("nan")).numpy()
    finite = scores[torch.isfinite(scores)]
    vmax = float(finite.abs().max()) if finite.numel() else 1.0
    signed = bool((finite < -1e-6 * vmax).any()) if finite.numel() else False  # not float noise
    for layer in range(rows * columns):
        axis = axes[layer // columns][layer % columns]
        if layer >= num_layers:
            axis.axis("off")
            continue
        image = axis.imshow(
            values[..., layer],
            cmap="RdBu_r" if signed else "Reds",
            vmin=-vmax if signed else 0.0,
            vmax=vmax,
            aspect="auto",
        )
        axis.set_title(f"layer {layer}", fontsize=9)  # from 0, as info["score_axis"] and model.layers[i]
        axis.set_xticks(range(len(column_tokens)), column_tokens, rotation=90, fontsize=7)
        axis.set_yticks(range(len(row_tokens)), row_tokens, fontsize=7)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6)
    if title:
        figure.suptitle(title)
    return figure


def figure_png_base64(figure) -> str:
    """The figure as a base64 PNG (for self-contained HTML), closing it."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
