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
from .figures import figure_png_base64, layer_figure

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
.layers img { max-width: 100%; border: 1px solid #ddd; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; }
"""


def cell_style(value: float, scale: float, signed: bool) -> str:
    """Background red for positive scores, blue for negative ones (signed methods), intensity by |value|; white
    text on strong colours."""
    if not math.isfinite(value) or scale <= 0:
        return "background:#ffffff"
    strength = min(1.0, abs(value) / scale)
    fade = round(255 * (1 - strength))
    background = f"rgb(255,{fade},{fade})" if value >= 0 or not signed else f"rgb({fade},{fade},255)"
    return f"background:{background}" + (";color:#fff" if strength > 0.6 else "")


def heatmap_table(scores: torch.Tensor, rows: list[str], columns: list[str], caption: str, table_id: str,
                  signed: bool | None = None) -> str:  # fmt: skip
    """An HTML table of ``(rows, columns)`` scores with coloured cells, its caption saying what the colours mean.

    Args:
        signed: Whether the scores are signed contributions (red positive, blue negative) or maps (red only); None:
            signed when a score is negative.
    """
    finite = scores[torch.isfinite(scores)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    if signed is None:
        signed = bool((finite < -1e-6 * scale).any()) if finite.numel() else False  # not float noise
    caption = f"{caption} · {colour_legend(signed, scale, bool(torch.isnan(scores).any()))}"
    head = "".join(f"<th>{html.escape(token)}</th>" for token in columns)
    body = []
    for row, token in enumerate(rows):
        cells = []
        for column in range(len(columns)):
            value = float(scores[row, column])
            if math.isnan(value):
                cells.append('<td class="nan"></td>')
            else:
                cells.append(f'<td style="{cell_style(value, scale, signed)}">{value:.2g}</td>')
        body.append(f"<tr><th>{html.escape(token)}</th>{''.join(cells)}</tr>")
    return (
        f'<table class="heatmap" id="{table_id}"><caption>{html.escape(caption)}</caption>'
        f"<tr><th></th>{head}</tr>{''.join(body)}</table>"
    )


def metrics_table(comparison: Comparison) -> str:
    """The per-method summary: faithfulness metrics with their random baselines, and rank agreement."""
    summary = comparison.summary()
    methods = [row["method"] for row in summary]
    columns = ["explains", "tokens", *METRICS, *(f"random_{name}" for name in METRICS),
               *(f"spearman_{m}" for m in methods)]  # fmt: skip
    head = "".join(f"<th>{html.escape(name)}</th>" for name in ["method", *columns])
    rows = []
    for row in summary:
        cells = []
        for name in columns:
            value = row.get(name, "")
            cells.append(f"<td>{value:.3f}</td>" if isinstance(value, float) else f"<td>{value}</td>")
        rows.append(f"<tr><th>{html.escape(row['method'])}</th>{''.join(cells)}</tr>")
    return f'<table id="metrics"><tr>{head}</tr>{"".join(rows)}</table>'


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
    colours = "red: positive, blue: negative contribution" if signed else "red: more mixing (a map: no sign)"
    blank = "; blank: a token the position cannot see" if blanks else ""
    return f"{colours}; full colour at the largest |score| of this table, {scale:.2g}{blank}"


def sequence_heatmaps(seq, method: str, index: int) -> str:
    """One sequence output's source and target heatmaps side by side (table ids ``METHOD-INDEX-source|target``);
    a logit method's tables are signed whatever their values, a map's never."""
    from ..frontends.sequences import MixingSequenceOutput, SignedMixingSequenceOutput

    kinds = {SignedMixingSequenceOutput: True, MixingSequenceOutput: False}  # others (Inseq's): by their values
    signed = kinds.get(type(seq))
    source, target = token_level_scores(seq)
    generated = [token.token for token in seq.target[seq.attr_pos_start :]]
    tables = []
    if source is not None:
        rows = [token.token for token in seq.source]
        tables.append(heatmap_table(source, rows, generated, "source", f"{method}-{index}-source", signed))
    if target is not None:  # encoder-only models' outputs have source scores only
        rows = [token.token for token in seq.target]
        tables.append(heatmap_table(target, rows, generated, "target", f"{method}-{index}-target", signed))
    return f'<div class="heatmaps">{"".join(tables)}</div>'


def method_section(method: str, out) -> str:
    """Each sentence's source and target heatmaps side by side, then per-layer panels where the method has them."""
    parts = [f'<section class="method" id="method-{html.escape(method)}"><h2>{html.escape(method)}</h2>']
    for index, seq in enumerate(out.sequence_attributions):
        parts.append(sequence_heatmaps(seq, method, index))
        parts.append(layer_panels(seq, method))
    parts.append("</section>")
    return "".join(parts)


def render_report(comparison: Comparison, title: str = "inseq-mixing report", notes: str = "") -> str:
    """The whole report as one HTML string."""
    sections = "".join(method_section(method, out) for method, out in comparison.outputs.items())
    if comparison.failed:
        failures = "".join(
            f"<li><b>{html.escape(name)}</b>: {html.escape(reason)}</li>" for name, reason in comparison.failed.items()
        )
        notes += f'<div class="failed"><h2>Methods that failed</h2><ul>{failures}</ul></div>'
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{notes}"
        "<h2>Faithfulness and agreement</h2><p>Comprehensiveness: drop of the token's probability (logit) when its "
        "most attributed context tokens are replaced (higher is more faithful); sufficiency: drop when only they are "
        "kept (lower is more faithful); random_*: the same for random rankings; spearman_*: mean rank correlation."
        f"</p>{metrics_table(comparison)}{sections}</body></html>"
    )


def write_report(comparison: Comparison, path: str | Path, **kwargs) -> Path:
    """Write :func:`render_report` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(comparison, **kwargs), encoding="utf-8")
    return path
