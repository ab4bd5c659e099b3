"""Reading evaluation rows: the columns each protocol needs, word marks (evidence, cues) and gold alignments.

Columns (each renamable): ``source`` (encoder–decoders), ``prefix`` (the target-side context before the explained
word; the prompt of decoder-only models), ``target`` (the explained word; for ``alignment`` and ``faithfulness`` the
whole target text), ``foil`` (optional contrast word), ``evidence`` / ``cues`` (words of the context: a JSON list of
words or of context word indices, or a whitespace-separated string of words; a word marks every occurrence), and
``alignment`` (Pharaoh links ``"source-target"`` between word indices). Context word indices count the source words
first, then the prefix words.
"""

import json
from dataclasses import dataclass

from ..runs.data import DatasetInputError, read_rows
from .metrics import parse_pharaoh

PROTOCOLS = ("evidence", "cue", "alignment", "faithfulness")
#: Column roles and their default names.
DEFAULT_COLUMNS = {
    "source": "source",
    "prefix": "prefix",
    "target": "target",
    "foil": "foil",
    "evidence": "evidence",
    "cues": "cues",
    "alignment": "alignment",
}
#: Roles each protocol needs besides the context (source for encoder–decoders, prefix for decoder-only models).
REQUIRED = {"evidence": ("target", "evidence"), "cue": ("target", "cues"), "alignment": ("target", "alignment"),
            "faithfulness": ("target",)}  # fmt: skip


class EvaluationInputError(DatasetInputError):
    """Bad evaluation data: a missing column, a marked word not in the context, an alignment index out of range."""


@dataclass
class Item:
    """One evaluation row.

    Attributes:
        row: Row number in the data (0-based).
        source: Source text (encoder–decoders), else None.
        prefix: Target-side context before the explained word (decoder-only: the prompt).
        target: The explained word (``evidence``, ``cue``), or the text after the prefix (``faithfulness``; the whole
            translation of an encoder–decoder), or the whole translation (``alignment``).
        foil: The contrast word, or None.
        marks: Evidence or cue word indices in the context (source words, then prefix words).
        gold: Gold alignment links ``(source word, target word)``, or None.
    """

    row: int
    source: str | None
    prefix: str
    target: str
    foil: str | None = None
    marks: list[int] | None = None
    gold: set[tuple[int, int]] | None = None

    @property
    def context_words(self) -> list[str]:
        return (self.source or "").split() + self.prefix.split()

    @property
    def generated_text(self) -> str:
        """The target side the model is forced to: prefix and explained word (decoder-only: the full text)."""
        return " ".join(part for part in (self.prefix.strip(), self.target.strip()) if part)

    @property
    def contrast_text(self) -> str | None:
        return None if self.foil is None else " ".join(part for part in (self.prefix.strip(), self.foil) if part)


def _value(row: dict, column: str | None):
    value = None if column is None else row.get(column)
    if (
        value is None
        or (isinstance(value, float) and value != value)
        or (isinstance(value, str) and not value.strip())
    ):
        return None
    return value


def read_items(data, protocol: str, encoder_decoder: bool, columns: dict[str, str] | None = None) -> list[Item]:
    """The rows of ``data`` as :class:`Item` for ``protocol``.

    Args:
        data: A path (JSONL, CSV, Parquet), a ``datasets.Dataset``, a DataFrame or a list of dicts.
        protocol: One of :data:`PROTOCOLS`.
        encoder_decoder: Whether the model has a source side (it then needs the ``source`` column).
        columns: Role → column name, overriding :data:`DEFAULT_COLUMNS`.

    Raises:
        EvaluationInputError: With the row number and what to fix.
    """
    if protocol not in PROTOCOLS:
        raise EvaluationInputError(f"Unknown protocol {protocol!r}: choose one of {PROTOCOLS}.")
    if protocol == "alignment" and not encoder_decoder:
        raise EvaluationInputError("The alignment protocol needs an encoder–decoder model (source and target words).")
    names = {**DEFAULT_COLUMNS, **{role: name for role, name in (columns or {}).items() if name}}
    unknown = set(columns or {}) - set(DEFAULT_COLUMNS)
    if unknown:
        raise EvaluationInputError(f"Unknown column role(s) {sorted(unknown)}; the roles are {list(DEFAULT_COLUMNS)}.")
    rows = read_rows(data)
    present = set().union(*(row.keys() for row in rows))
    needed = list(REQUIRED[protocol]) + ["source" if encoder_decoder else "prefix"]
    for role in needed:
        if names[role] not in present:
            raise EvaluationInputError(
                f"The {protocol} protocol needs a {role} column, and the data has no column {names[role]!r}; its "
                f"columns are {sorted(present)}. Name the right one with --{role}-column."
            )
    return [_item(index, row, protocol, encoder_decoder, names) for index, row in enumerate(rows)]


def _item(index: int, row: dict, protocol: str, encoder_decoder: bool, names: dict[str, str]) -> Item:
    def text(role: str, required: bool = True) -> str | None:
        value = _value(row, names[role])
        if value is None and required:
            raise EvaluationInputError(f"Row {index} has no {role} ({names[role]!r}) value.")
        return None if value is None else str(value)

    source = text("source") if encoder_decoder else None
    prefix = "" if protocol == "alignment" else text("prefix", required=not encoder_decoder) or ""
    item = Item(index, source, prefix, text("target"), foil=text("foil", required=False))
    if protocol in ("evidence", "cue"):
        if len(item.target.split()) != 1:
            raise EvaluationInputError(f"Row {index}: the target {item.target!r} must be one word.")
        role = "evidence" if protocol == "evidence" else "cues"
        item.marks = mark_indices(_value(row, names[role]), item.context_words, index, role)
    if protocol == "alignment":
        item.gold = gold_links(text("alignment"), item, index)
    return item


def mark_indices(value, context: list[str], row: int, role: str) -> list[int]:
    """Context word indices marked by ``value``: a list (JSON) of indices or words, or a string of words."""
    if value is None:
        raise EvaluationInputError(f"Row {row} has no {role}.")
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value.split()
        value = parsed if isinstance(parsed, list) else value.split()
    elif not isinstance(value, list | tuple):
        value = list(value) if hasattr(value, "__iter__") else [value]
    marks = []
    for mark in value:
        if isinstance(mark, int | float) and not isinstance(mark, bool):
            if not 0 <= int(mark) < len(context):
                raise EvaluationInputError(
                    f"Row {row}: {role} index {int(mark)} is outside the context's {len(context)} words {context}."
                )
            marks.append(int(mark))
            continue
        found = [position for position, word in enumerate(context) if word == str(mark)]
        if not found:
            raise EvaluationInputError(f"Row {row}: the {role} word {str(mark)!r} is not in the context {context}.")
        marks.extend(found)
    if not marks:
        raise EvaluationInputError(f"Row {row} has an empty {role} list.")
    return sorted(set(marks))


def gold_links(text: str, item: Item, row: int) -> set[tuple[int, int]]:
    """Parse and check a row's Pharaoh links against its source and target word counts."""
    try:
        links = parse_pharaoh(text)
    except ValueError as error:
        raise EvaluationInputError(f"Row {row}: {error}.") from error
    num_source, num_target = len(item.source.split()), len(item.target.split())
    bad = sorted((s, t) for s, t in links if not (0 <= s < num_source and 0 <= t < num_target))
    if bad:
        raise EvaluationInputError(
            f"Row {row}: alignment link(s) {['-'.join(map(str, link)) for link in bad]} fall outside the "
            f"{num_source} source and {num_target} target words (Pharaoh format: source-target, 0-based)."
        )
    if not links:
        raise EvaluationInputError(f"Row {row} has no alignment links.")
    return links
