"""A self-contained HTML report of a :class:`~inseq_mixing.evaluation.compare.Comparison`: metrics tables, each
method's source and target heatmaps side by side, and per-layer context-mixing panels. No network assets: styles are
inline and figures are embedded PNGs.

Inseq's own HTML heatmaps lose their colours under numpy 2, so the heatmaps are rendered here.
"""

import html
import math
from pathlib import Path

import torch

from ..evaluation.comparison import METRICS, Comparison, token_level_scores
from .colours import css_colour, scale_name
from .figures import figure_png_base64, layer_figure
from .images import image_figures

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
p, li, caption { overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: 0.4em 0 1em 0; font-size: 12px; display: block; max-width: 100%;
        overflow-x: auto; }
.heatmaps > * { min-width: 0; max-width: 100%; }
img { max-width: 100%; }
mark.gold { background: #ffe58a; font-weight: bold; }
th, td { border: 1px solid #ccc; padding: 2px 5px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; }
.heatmaps { display: flex; flex-wrap: wrap; gap: 2em; align-items: flex-start; }
.heatmap td { min-width: 2.6em; }
.heatmap td.nan { background: #eee; }
.heatmap td.gold { outline: 2px solid #111; outline-offset: -2px; }
.layers img { max-width: 100%; border: 1px solid #ddd; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; }
"""


def cell_style(value: float, scale: float, signed: bool) -> str:
    """The cell's colour on the shared scales (:mod:`.colours`: red for positive scores, blue for negative ones of
    signed methods, intensity by |value|); white text on strong colours."""
    if not math.isfinite(value) or scale <= 0:
        return "background:#ffffff"
    strength = min(1.0, abs(value) / scale)
    return f"background:{css_colour(value, scale, signed)}" + (";color:#fff" if strength > 0.6 else "")


def heatmap_table(scores: torch.Tensor, rows: list[str], columns: list[str], caption: str, table_id: str,
                  signed: bool | None = None, marked: set[tuple[int, int]] = frozenset()) -> str:  # fmt: skip
    """An HTML table of ``(rows, columns)`` scores with coloured cells, its caption saying what the colours mean.

    Args:
        signed: Whether the scores are signed contributions (red positive, blue negative) or maps (red only); None:
            signed when a score is negative.
        marked: ``(row, column)`` cells outlined (gold alignment links), said in the caption.
    """
    finite = scores[torch.isfinite(scores)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    if signed is None:
        signed = bool((finite < -1e-6 * scale).any()) if finite.numel() else False  # not float noise
    caption = f"{caption} · {colour_legend(signed, scale, bool(torch.isnan(scores).any()))}"
    if marked:
        caption += "; outlined: gold links"
    head = "".join(f"<th>{html.escape(token)}</th>" for token in columns)
    body = []
    for row, token in enumerate(rows):
        cells = []
        for column in range(len(columns)):
            value = float(scores[row, column])
            gold = ' class="gold"' if (row, column) in marked else ""
            if math.isnan(value):
                cells.append(f'<td class="nan"{gold}></td>')
            else:
                cells.append(f'<td{gold} style="{cell_style(value, scale, signed)}">{value:.2g}</td>')
        body.append(f"<tr><th>{html.escape(token)}</th>{''.join(cells)}</tr>")
    return (
        f'<table class="heatmap" id="{table_id}"><caption>{html.escape(caption)}</caption>'
        f"<tr><th></th>{head}</tr>{''.join(body)}</table>"
    )


def metrics_table(summary: list[dict]) -> str:
    """The per-method summary (:meth:`Comparison.summary`): faithfulness metrics with their random baselines."""
    columns = ["explains", "tokens", *METRICS, *(f"random_{name}" for name in METRICS)]
    head = "".join(f"<th>{html.escape(name)}</th>" for name in ["method", *columns])
    rows = []
    for row in summary:
        cells = []
        for name in columns:
            value = row.get(name, "")
            cells.append(f"<td>{value:.3f}</td>" if isinstance(value, float) else f"<td>{value}</td>")
        rows.append(f"<tr><th>{html.escape(row['method'])}</th>{''.join(cells)}</tr>")
    return f'<table id="metrics"><tr>{head}</tr>{"".join(rows)}</table>'


def agreement_table(summary: list[dict]) -> str:
    """The mean Spearman rank correlation of every two methods (:meth:`Comparison.summary`), as a methods × methods
    table of its own (narrow: it never hides behind the metrics table's scroll)."""
    methods = [row["method"] for row in summary]
    if len(methods) < 2:
        return ""
    head = "".join(f"<th>{html.escape(method)}</th>" for method in methods)
    rows = []
    for row in summary:
        cells = []
        for other in methods:
            value = 1.0 if other == row["method"] else row.get(f"spearman_{other}")
            cells.append(f"<td>{value:.2f}</td>" if isinstance(value, float) and math.isfinite(value) else "<td></td>")
        rows.append(f"<tr><th>{html.escape(row['method'])}</th>{''.join(cells)}</tr>")
    return (
        "<h2>Agreement</h2><p>Mean Spearman rank correlation of two methods' scores over the same context tokens "
        f'(1: the same ranking).</p><table id="agreement"><tr><th></th>{head}</tr>{"".join(rows)}</table>'
    )


def layer_panels(seq, method: str) -> str:
    """Per-layer panels (embedded PNG) for a per-layer context-mixing output; empty for other outputs."""
    if type(seq).__name__.startswith("Granular"):
        return ""
    sides = [("source", seq.source_attributions, seq.source), ("target", seq.target_attributions, seq.target)]
    blocks = [
        (side, scores, [token.token for token in tokens]) for side, scores, tokens in sides if scores is not None
    ]
    if not blocks or blocks[-1][1].ndim != 3:  # encoder-only outputs have source scores only
        return ""
    generated = [token.token for token in seq.target[seq.attr_pos_start :]]
    images = []
    for side, scores, rows in blocks:
        figure = layer_figure(scores, rows, generated, title=f"{method}: {side} scores per layer")
        images.append(f'<img alt="{method} {side} per layer" src="data:image/png;base64,{figure_png_base64(figure)}">')
    return f'<div class="layers">{"".join(images)}</div>'


def colour_legend(signed: bool, scale: float, blanks: bool) -> str:
    """What a heatmap's colours mean: signed scores red (positive) and blue (negative), maps red, each table scaled to
    its own largest absolute score; blank cells, where a position cannot see the token."""
    colours = scale_name(signed)
    blank = "; blank: a token the position cannot see" if blanks else ""
    return f"{colours}; full colour at the largest |score| of this table, {scale:.2g}{blank}"


def sequence_heatmaps(seq, method: str, index: int, columns: list[int] | None = None,
                      labels: list[str] | None = None, marked: set[tuple[int, int]] = frozenset()) -> str:  # fmt: skip
    """One sequence output's source and target heatmaps side by side (table ids ``METHOD-INDEX-source|target``);
    a logit method's tables are signed whatever their values, a map's never.

    Args:
        seq: The Inseq sequence output.
        method: The method's name.
        index: The sequence's number (for the table ids).
        columns: Only these generated columns (an evaluation's explained token), or all.
        labels: Their headers (default: the generated tokens).
        marked: Source-table cells ``(source token, column)`` to outline (gold alignment links).
    """
    from ..frontends.sequences import MixingSequenceOutput, SignedMixingSequenceOutput

    kinds = {SignedMixingSequenceOutput: True, MixingSequenceOutput: False}  # others (Inseq's): by their values
    signed = kinds.get(type(seq))
    source, target = token_level_scores(seq)
    generated = [token.token for token in seq.target[seq.attr_pos_start :]]
    if columns is not None:
        source = None if source is None else source[:, columns]
        target = None if target is None else target[:, columns]
        generated = labels or [generated[column] for column in columns]
    tables = []
    if source is not None:
        rows = [token.token for token in seq.source]
        tables.append(heatmap_table(source, rows, generated, "source", f"{method}-{index}-source", signed, marked))
    if target is not None:  # encoder-only models' outputs have source scores only
        rows = [token.token for token in seq.target]
        tables.append(heatmap_table(target, rows, generated, "target", f"{method}-{index}-target", signed))
    return f'<div class="heatmaps">{"".join(tables)}</div>'


def method_section(method: str, out, examples: int | None = None, images: list | None = None) -> str:
    """Each sentence's caption, its source and target heatmaps side by side, then per-layer panels where the method
    has them (the first ``examples`` sentences, or all); with ``images`` (an image classifier's comparison), each
    image's scores drawn over it instead, every figure captioned with its colour scale."""
    sequences = out.sequence_attributions
    shown = sequences if examples is None else sequences[:examples]
    parts = [f'<section class="method" id="method-{html.escape(method)}"><h2>{html.escape(method)}</h2>']
    if len(shown) < len(sequences):
        parts.append(f"<p>The first {len(shown)} of {len(sequences)} sentences.</p>")
    if images is not None:
        parts += [image_figures(seq, image, f"image {index + 1}", method) for index, (seq, image) in
                  enumerate(zip(shown, images, strict=False))]  # fmt: skip
        return "".join([*parts, "</section>"])
    for index, seq in enumerate(shown):
        parts.append(f'<p class="example">{html.escape(example_caption(seq, index))}</p>')
        parts.append(sequence_heatmaps(seq, method, index))
        parts.append(layer_panels(seq, method))
    parts.append("</section>")
    return "".join(parts)


def example_caption(seq, index: int) -> str:
    """``sentence N: source → generated`` (tokens joined; decoder-only: the prompt and what follows it)."""
    source = " ".join(token.token for token in seq.source or seq.target[: seq.attr_pos_start])
    generated = " ".join(token.token for token in seq.target[seq.attr_pos_start :])
    return f"sentence {index + 1}: {source} → {generated}"


def render_report(comparison: Comparison, title: str = "inseq-mixing report", notes: str = "",
                  examples: int | None = None) -> str:  # fmt: skip
    """The whole report as one HTML string (``examples``: sentences shown per method, default all)."""
    sections = "".join(method_section(method, out, examples, comparison.images)
                       for method, out in comparison.outputs.items())  # fmt: skip
    summary = comparison.summary()  # one pass over the token and agreement rows, for both tables
    if comparison.failed:
        failures = "".join(
            f"<li><b>{html.escape(name)}</b>: {html.escape(reason)}</li>" for name, reason in comparison.failed.items()
        )
        notes += f'<div class="failed"><h2>Methods that failed</h2><ul>{failures}</ul></div>'
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{notes}"
        "<h2>Faithfulness</h2><p>explains: what each method's scores explain (map: a context-mixing map, no "
        "output). Comprehensiveness: drop of the token's probability (logit) when its most attributed context "
        "tokens are replaced (higher is more faithful); sufficiency: drop when only they are kept (lower is more "
        "faithful); random_*: the same for random rankings."
        f"</p>{metrics_table(summary)}{agreement_table(summary)}{sections}</body></html>"
    )


def write_report(comparison: Comparison, path: str | Path, **kwargs) -> Path:
    """Write :func:`render_report` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(comparison, **kwargs), encoding="utf-8")
    return path
