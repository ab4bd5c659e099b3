"""Reading evaluation rows: the columns each protocol needs, word marks (evidence, cues) and gold alignments.

Columns (each renamable): ``source`` (encoder–decoders), ``prefix`` (the target-side context before the explained
word; the prompt of decoder-only models), ``target`` (the explained word, possibly of several words such as
``grocery store``; for ``alignment`` and ``faithfulness`` the whole target text), ``foil`` (optional contrast word),
``evidence`` / ``cues`` (words of the context: a JSON list of words or of integer context word indices, or a
whitespace-separated string of words; a word marks every occurrence, matched as written or, failing that, with its
surrounding punctuation stripped), and ``alignment`` (Pharaoh links ``"source-target"`` between word indices). Context
word indices count the source words first, then the prefix words.

A row that cannot be evaluated (a missing value, a marked word not in the context, a fractional index, ...) is skipped
with its reason (:func:`read_items_skipping`); a missing column stops the whole file.
"""

import json
import numbers
import string
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Skipped:
    """A row left out of an evaluation, and why."""

    row: int
    reason: str
    kind: str = "bad row"

    def to_dict(self) -> dict:
        return {"row": self.row, "kind": self.kind, "reason": self.reason}


@dataclass
class Item:
    """One evaluation row.

    Attributes:
        row: Row number in the data (0-based).
        source: Source text (encoder–decoders), else None.
        prefix: Target-side context before the explained word (decoder-only: the prompt).
        target: The explained word (``evidence``, ``cue``; once prepared by :func:`~.targets.prepare_targets`, the text
            of the explained token(s)), or the text after the prefix (``faithfulness``; the whole translation of an
            encoder–decoder), or the whole translation (``alignment``).
        foil: The contrast word (prepared: the text of its token(s)), or None.
        marks: Evidence or cue word indices in the context (source words, then prefix words).
        gold: Gold alignment links ``(source word, target word)``, or None.
        word: The target as written in the data (``target`` before preparation).
        foil_word: The foil as written in the data.
        unknown: Context word indices that the tokenizer maps (in part) to its unknown token: they keep their scores
            and are listed in the evaluation's output.
    """

    row: int
    source: str | None
    prefix: str
    target: str
    foil: str | None = None
    marks: list[int] | None = None
    gold: set[tuple[int, int]] | None = None
    word: str | None = None
    foil_word: str | None = None
    unknown: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.word = self.target if self.word is None else self.word
        self.foil_word = self.foil if self.foil_word is None else self.foil_word

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
    """The rows of ``data`` as :class:`Item` for ``protocol``, every row required to be usable.

    Args:
        data: A path (JSONL, CSV, Parquet), a ``datasets.Dataset``, a DataFrame or a list of dicts.
        protocol: One of :data:`PROTOCOLS`.
        encoder_decoder: Whether the model has a source side (it then needs the ``source`` column).
        columns: Role → column name, overriding :data:`DEFAULT_COLUMNS`.

    Raises:
        EvaluationInputError: With the row number and what to fix (the first unusable row).
    """
    items, skipped = read_items_skipping(data, protocol, encoder_decoder, columns)
    if skipped:
        raise EvaluationInputError(skipped[0].reason)
    return items


def read_items_skipping(
    data, protocol: str, encoder_decoder: bool, columns: dict[str, str] | None = None
) -> tuple[list[Item], list[Skipped]]:
    """Like :func:`read_items`, but a row that cannot be evaluated is skipped with its reason instead of stopping the
    file.

    Returns:
        The usable items and the skipped rows.

    Raises:
        EvaluationInputError: An unknown protocol or column role, or a missing column.
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
    items, skipped = [], []
    for index, row in enumerate(rows):
        try:
            items.append(_item(index, row, protocol, encoder_decoder, names))
        except EvaluationInputError as error:
            skipped.append(Skipped(index, str(error)))
    return items, skipped


def _item(index: int, row: dict, protocol: str, encoder_decoder: bool, names: dict[str, str]) -> Item:
    def text(role: str, required: bool = True) -> str | None:
        value = _value(row, names[role])
        if value is None and required:
            raise EvaluationInputError(f"Row {index} has no {role} ({names[role]!r}) value.")
        return None if value is None else str(value).strip()

    source = text("source") if encoder_decoder else None
    prefix = "" if protocol == "alignment" else text("prefix", required=not encoder_decoder) or ""
    item = Item(index, source, prefix, text("target"), foil=text("foil", required=False))
    if protocol in ("evidence", "cue"):
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
        if isinstance(parsed, numbers.Real) and not isinstance(parsed, bool):  # one index, e.g. "3" in a CSV
            parsed = [parsed]
        value = parsed if isinstance(parsed, list) else value.split()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = [value]
    elif not isinstance(value, list | tuple):
        value = list(value) if hasattr(value, "__iter__") else [value]
    marks = []
    bare = [word.strip(string.punctuation) for word in context]
    for mark in value:
        if isinstance(mark, numbers.Real) and not isinstance(mark, bool):
            if not float(mark).is_integer():
                raise EvaluationInputError(
                    f"Row {row}: {role} index {mark!r} is not an integer (context word indices are 0-based integers)."
                )
            if not 0 <= int(mark) < len(context):
                raise EvaluationInputError(
                    f"Row {row}: {role} index {int(mark)} is outside the context's {len(context)} words {context}."
                )
            marks.append(int(mark))
            continue
        found = [position for position, word in enumerate(context) if word == str(mark)]
        if not found and str(mark).strip(string.punctuation):
            found = [position for position, word in enumerate(bare) if word == str(mark).strip(string.punctuation)]
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
