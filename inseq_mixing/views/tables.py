"""Plain-text tables for the terminal (the CLI's and the demo's summaries)."""


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A plain-text table of ``rows`` restricted to ``columns``."""
    cells = [columns] + [
        [f"{row.get(c):.3f}" if isinstance(row.get(c), float) else str(row.get(c, "")) for c in columns]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(value.rjust(width) for value, width in zip(line, widths, strict=True)))


SUMMARY_COLUMNS = [
    "method",
    "explains",
    "tokens",
    "comprehensiveness_prob",
    "random_comprehensiveness_prob",
    "sufficiency_prob",
    "random_sufficiency_prob",
]


#: What each column of a comparison's summary means (printed under the table: :func:`print_legend`).
LEGEND = {
    "explains": "what the method explains (logit, probability, or map for context-mixing maps)",
    "tokens": "generated tokens scored",
    "comprehensiveness_prob": "AOPC: how much the token's probability drops when its top-ranked context tokens are "
    "removed (higher: more faithful)",
    "random_comprehensiveness_prob": "the same for random rankings (the baseline to beat)",
    "sufficiency_prob": "AOPC: how much it drops when only the top-ranked tokens are kept (lower: more faithful)",
    "random_sufficiency_prob": "the same for random rankings",
    "alignment_accuracy": "share of generated words whose most attributed source word is their aligned word (demo)",
}


def print_legend(columns: list[str]) -> None:
    """One line per column of ``columns`` that :data:`LEGEND` explains."""
    for column in columns:
        if column in LEGEND:
            print(f"  {column}: {LEGEND[column]}")


def p_value_text(p_value: float, bare: bool = False) -> str:
    """A permutation test's p-value as a reader expects it: ``p < 0.001`` below a thousandth, else ``p = `` and three
    digits (``bare``: without the ``p``, for a column headed by it)."""
    text = "p < 0.001" if p_value < 0.001 else f"p = {p_value:.3g}"
    return text.removeprefix("p = ").removeprefix("p ") if bare else text
