"""Annotated data for every evaluation protocol, exported from the demo grammar (whose alignments and agreement cues
are known by construction).

Files (JSONL, one object per line; context word indices count the source words first, then the prefix words):

* ``evidence.jsonl``: ``source``, ``prefix`` (the translation up to the verb), ``target`` (the verb), ``foil`` (the
  verb in the other number), ``evidence`` (indices of the words that decide the verb's number: the subject's head
  noun in the source and in the prefix, and the source verb, whose English form carries the number too);
* ``cue.jsonl``: ``source``, ``prefix``, ``target`` (a determiner, adjective or verb), ``cues`` (indices of the noun
  it agrees with: in the source, and in the prefix when it is already there);
* ``alignment.jsonl``: ``source``, ``target``, ``alignment`` (Pharaoh ``source-target`` word links);
* ``faithfulness.jsonl``: ``source``, ``target``;
* ``context.jsonl``: another task, for the retrieval demo model (``--model demo-retrieval``): ``passages``,
  ``question``, ``answer``, ``gold`` (:mod:`.retrieval`);
* ``evidence_alti_logit_layout.csv``: the evidence rows in the column layout of the ALTI-logit paper's released
  CSVs (``one_prefix_prefix``, ``one_prefix_word_good``, ``one_prefix_word_bad``, and ``target`` holding the evidence
  word), plus ``source``; rows whose evidence word occurs twice in the context are left out.
"""

import csv
import json
import random
from pathlib import Path

from .grammar import VERBS, Example, sample

#: French verb form → the same verb in the other number.
OTHER_NUMBER = {
    form: other for singular, plural in VERBS.values() for form, other in ((singular, plural), (plural, singular))
}


def _row(example: Example, position: int) -> dict:
    return {"source": " ".join(example.source), "prefix": " ".join(example.target[:position])}


def _head_noun_marks(example: Example, position: int) -> list[int]:
    """Context indices of the noun the target word at ``position`` agrees with: source, and prefix if present."""
    noun = example.agreement[position]
    marks = [noun]
    marks += [len(example.source) + j for j in range(position) if example.alignment[j] == noun]
    return marks


def evaluation_rows(count: int = 40, seed: int = 11) -> dict[str, list[dict]]:
    """Rows of every protocol from ``count`` sentence pairs (half with a "near ..." attractor)."""
    rng = random.Random(seed)
    rows = {"evidence": [], "cue": [], "alignment": [], "faithfulness": [], "alti_logit_layout": []}
    for index in range(count):
        example = sample(rng, attractor_rate=float(index % 2))
        source, target = " ".join(example.source), " ".join(example.target)
        rows["alignment"].append(
            {
                "source": source,
                "target": target,
                "alignment": " ".join(f"{s}-{t}" for t, s in enumerate(example.alignment)),
            }
        )
        rows["faithfulness"].append({"source": source, "target": target})
        for position, word in enumerate(example.target):
            if example.agreement[position] is None:
                continue
            marks = _head_noun_marks(example, position)
            rows["cue"].append({**_row(example, position), "target": word, "cues": marks})
            if word not in OTHER_NUMBER:
                continue
            evidence = sorted({*marks, example.alignment[position]})
            rows["evidence"].append(
                {**_row(example, position), "target": word, "foil": OTHER_NUMBER[word], "evidence": evidence}
            )
            context = example.source + example.target[:position]
            evidence_word = example.source[example.agreement[position]]
            if context.count(evidence_word) == 1:
                rows["alti_logit_layout"].append(
                    {
                        "source": source,
                        "one_prefix_prefix": " ".join(example.target[:position]),
                        "one_prefix_word_good": word,
                        "one_prefix_word_bad": OTHER_NUMBER[word],
                        "target": evidence_word,
                    }
                )
    return rows


def export_evaluation_data(folder: str | Path, count: int = 40, seed: int = 11) -> dict[str, Path]:
    """Write the files described in this module's docstring into ``folder``; returns protocol → path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = evaluation_rows(count, seed)
    paths = {}
    for protocol in ("evidence", "cue", "alignment", "faithfulness"):
        path = paths[protocol] = folder / f"{protocol}.jsonl"
        path.write_text(
            "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows[protocol]), encoding="utf-8"
        )
    from .retrieval import rows as retrieval_rows

    path = paths["context"] = folder / "context.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in retrieval_rows(count, seed)), encoding="utf-8")
    path = paths["alti_logit_layout"] = folder / "evidence_alti_logit_layout.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows["alti_logit_layout"][0]))
        writer.writeheader()
        writer.writerows(rows["alti_logit_layout"])
    return paths
