"""A self-contained HTML page of an :class:`~inseq_mixing.evaluation.Evaluation`: the metrics with their bootstrap
intervals and the random baseline, the paired tests, the per-layer cue-contribution figure, and example heatmaps."""

import html
from pathlib import Path

from .figures import figure_png_base64, plt
from .images import image_figures
from .report import STYLE, sequence_heatmaps
from .tables import p_value_text

DESCRIPTIONS = {
    "evidence": "Mean reciprocal rank of the best-ranked evidence word among the context words (word score = sum of "
    "its subword scores; ties share their mean rank). Higher is better.",
    "cue": "Share of the explained word's scores (absolute values) on its cue words: per layer for per-layer methods "
    "(the table gives their mean), the total for rolled-out and logit methods. Higher is better. Speech models: "
    "cue_contribution is the share on the cue words' audio units (Whisper: through cross-attention; CTC encoders: "
    "the target word's row of the unit map), text_cue_contribution the share on cue words the decoder wrote before "
    "the target; '(random init)' marks a randomly initialised copy of the model.",
    "alignment": "Alignment error rate against the gold links, each target word linked to its highest-scoring source "
    "word (lower is better), and the share of target words whose predicted source word is a gold one (higher is "
    "better).",
    "blankout": "Speech models: drop of the probability of the target word's first token when the cue words' audio "
    "is replaced by silence, when a random other word's is (the control), and when the cue words' tokens in the "
    "decoder's text are replaced by the unknown token. Higher drops mean the model relies more on the cues.",
    "faithfulness": "AOPC comprehensiveness (drop of the token's probability when its top-ranked context tokens are "
    "replaced; higher is better) and sufficiency (drop when only they are kept; lower is better), over every "
    "generated token.",
}


def _number(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else html.escape(str(value))


def metrics_table(evaluation) -> str:
    """Per method: each metric with its 95% interval, and the number of items; then the random baseline."""
    metrics = evaluation.metrics
    head = "".join(f"<th>{html.escape(name)}</th><th>95% CI</th>" for name in metrics)
    rows = []
    for method in evaluation.results:
        summary = evaluation.method_summary(method)
        cells = []
        for index, metric in enumerate(metrics):
            low, high = summary["ci" if index == 0 else f"{metric}_ci"]
            interval = f"[{low:.3f}, {high:.3f}]"
            if metric in summary.get("degenerate", []):
                interval = (
                    f'<span class="degenerate" title="one item, or every item alike">{interval} degenerate</span>'
                )
            cells.append(f"<td>{summary[metric]:.3f}</td><td>{interval}</td>")
        rows.append(f"<tr><th>{html.escape(method)}</th>{''.join(cells)}<td>{summary['n']}</td></tr>")
    if evaluation.baseline:
        cells = "".join(f"<td>{_number(evaluation.baseline.get(m, ''))}</td><td></td>" for m in metrics)
        rows.append(f"<tr><th>random</th>{cells}<td></td></tr>")
    return f'<table id="metrics"><tr><th>method</th>{head}<th>n</th></tr>{"".join(rows)}</table>'


def pairs_table(evaluation) -> str:
    """The paired tests of the headline metric."""
    rows = "".join(
        f"<tr><th>{html.escape(pair['method_a'])} − {html.escape(pair['method_b'])}</th>"
        f"<td>{pair['difference']:+.3f}</td><td>{p_value_text(pair['p_value'], bare=True)}</td></tr>"
        for pair in evaluation.pairs()
    )
    metric = html.escape(evaluation.pairs()[0]["metric"] if evaluation.pairs() else evaluation.metrics[0])
    return (
        f'<table id="pairs"><tr><th>pair</th><th>difference of {metric}</th><th>p (paired permutation)</th></tr>'
        f"{rows}</table>"
    )


def cue_figure(evaluation) -> str:
    """Cue contribution per layer, one line per method (with its bootstrap band); methods without layers and the
    random baseline as horizontal lines. Empty for other protocols."""
    if evaluation.protocol != "cue":
        return ""
    figure, axis = plt.subplots(figsize=(6.5, 3.8))
    layered = [method for method, result in evaluation.results.items() if result.per_layer is not None]
    num_layers = max((len(evaluation.results[m].layer_statistics) for m in layered), default=1)
    for index, (method, result) in enumerate(evaluation.results.items()):
        summary, color = evaluation.method_summary(method), f"C{index % 10}"
        if result.per_layer is None:
            axis.axhline(summary["cue_contribution"], color=color, linestyle="--", label=f"{method} (total)")
            continue
        layers = list(range(len(summary["per_layer"])))  # from 0, as info["score_axis"] and model.layers[i]
        axis.plot(layers, summary["per_layer"], marker="o", color=color, label=method)
        lows, highs = zip(*summary["per_layer_ci"], strict=True)
        axis.fill_between(layers, lows, highs, alpha=0.15, color=color)
    if "cue_contribution" in evaluation.baseline:
        axis.axhline(evaluation.baseline["cue_contribution"], color="grey", linestyle=":", label="random")
    axis.set_xticks(range(num_layers))
    axis.set_xlabel("layer (from 0)")
    axis.set_ylabel("cue contribution")
    axis.legend(fontsize=8, loc="best")
    figure.tight_layout()
    image = figure_png_base64(figure)
    return f'<img id="cue-figure" alt="cue contribution per layer" src="data:image/png;base64,{image}">'


def gold_words(item, protocol: str) -> str:
    """The item's context with its gold evidence or cue words marked (``<mark class="gold">``), for the examples."""
    if protocol not in ("evidence", "cue") or not item.marks:
        return ""
    words = [
        f'<mark class="gold">{html.escape(word)}</mark>' if index in item.marks else html.escape(word)
        for index, word in enumerate(item.context_words)
    ]
    label = "evidence" if protocol == "evidence" else "cues"
    return f": context with its {label} marked: {' '.join(words)} → <b>{html.escape(item.word or item.target)}</b>"


def example_heatmaps(evaluation) -> str:
    """The first items' source and target heatmaps for each method."""
    parts = []
    for method, explanations in evaluation.examples.items():
        if not explanations:
            continue
        parts.append(f"<h3>{html.escape(method)}</h3>")
        for index, explanation in enumerate(explanations):
            if explanation.image is not None:  # an image's scores over the image
                name = html.escape(explanation.item.prefix or f"row {explanation.item.row}")
                parts.append(
                    f"<p>row {explanation.item.row}</p>"
                    f"{image_figures(explanation.seq, explanation.image, name, method)}"
                )
                continue
            heatmaps = sequence_heatmaps(explanation.seq, method, index, **example_view(explanation, evaluation))
            parts.append(
                f"<p>row {explanation.item.row}{gold_words(explanation.item, evaluation.protocol)}</p>{heatmaps}"
            )
    return "".join(parts)


def example_view(explanation, evaluation) -> dict:
    """What an example's heatmaps show: for ``evidence`` and ``cue``, only the explained token's column, headed
    ``target (vs foil)``; for ``alignment``, every column with the gold links outlined (the source tokens of a gold
    source word against the columns of its target word); otherwise every column as it is."""
    item = explanation.item
    if evaluation.protocol in ("evidence", "cue"):
        try:
            columns = explanation.explained_columns()
        except ValueError:
            return {}
        word = item.word or item.target
        label = f"{word} (vs {item.foil_word})" if item.foil_word else word
        generated = [token.token for token in explanation.seq.target[explanation.seq.attr_pos_start :]]
        labels = [label] if len(columns) == 1 else [f"{generated[c]} of {label}" for c in columns]
        return {"columns": columns, "labels": labels}
    if evaluation.protocol == "alignment" and item.gold and explanation.source_words is not None:
        start = explanation.seq.attr_pos_start
        owners = explanation.target_words[start:]  # the target word of each generated column
        marked = {(row, column) for row, source_word in enumerate(explanation.source_words)
                  for column, target_word in enumerate(owners) if (source_word, target_word) in item.gold}  # fmt: skip
        return {"marked": marked}
    return {}


def skipped_rows(evaluation) -> str:
    """The rows left out (with their reasons, by kind) and the context words mapped to the unknown token."""
    parts = []
    if evaluation.skipped:
        counts = ", ".join(f"{kind}: {count}" for kind, count in evaluation.skipped_counts().items())
        items = "".join(f"<li>{html.escape(skip.reason)}</li>" for skip in evaluation.skipped)
        parts.append(
            f'<div id="skipped"><h2>Skipped rows ({len(evaluation.skipped)}: {html.escape(counts)})</h2>'
            f"<ul>{items}</ul></div>"
        )
    if evaluation.unknown_words:
        items = "".join(
            f"<li>row {row}: {html.escape(', '.join(words))}</li>" for row, words in evaluation.unknown_words.items()
        )
        parts.append(
            '<div id="unknown-words"><h2>Context words the tokenizer does not know</h2><p>They are mapped to the '
            f"unknown token and keep its scores.</p><ul>{items}</ul></div>"
        )
    return "".join(parts)


def render_evaluation_report(evaluation, title: str = "inseq-mixing evaluation") -> str:
    """The whole page as one HTML string."""
    failed = ""
    if evaluation.failed:
        items = "".join(
            f"<li><b>{html.escape(name)}</b>: {html.escape(reason)}</li>" for name, reason in evaluation.failed.items()
        )
        failed = f'<div class="failed"><h2>Methods that failed</h2><ul>{items}</ul></div>'
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p>Protocol: <b>{html.escape(evaluation.protocol)}</b>. "
        f"{html.escape(evaluation.description or DESCRIPTIONS[evaluation.protocol])} "
        f"Intervals: percentile bootstrap over the items ({evaluation.draws} resamples).{_explained(evaluation)}</p>"
        f"<h2>Metrics</h2>{metrics_table(evaluation)}{cue_figure(evaluation)}"
        f"{section('Paired tests', pairs_table(evaluation) if evaluation.pairs() else '')}{failed}"
        f"{skipped_rows(evaluation)}{section('Examples', example_heatmaps(evaluation))}</body></html>"
    )


def section(heading: str, content: str) -> str:
    """A headed section, or nothing when it would be empty (one method: no paired test; blank-out: no heatmaps)."""
    return f"<h2>{html.escape(heading)}</h2>{content}" if content else ""


def _explained(evaluation) -> str:
    if evaluation.target_tokens == "first":
        return " Explained: the first token of each target word (the ALTI-logit paper's convention)."
    if evaluation.target_tokens == "whole":
        return (
            " Explained: every token of each target word, scores summed (for logit methods a sum of logits of "
            "different predictions, not a logit)."
        )
    return ""


def write_evaluation_report(evaluation, path: str | Path, **kwargs) -> Path:
    """Write :func:`render_evaluation_report` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_evaluation_report(evaluation, **kwargs), encoding="utf-8")
    return path
