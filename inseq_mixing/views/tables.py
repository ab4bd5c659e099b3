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
