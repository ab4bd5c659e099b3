"""A synthetic English → French-like translation grammar whose word alignments and agreement cues are known by
construction.

Source: ``DET [ADJ] NOUN [near DET [ADJ] NOUN] VERB DET [ADJ] NOUN``. Target: ``DET NOUN [ADJ] [près DET NOUN [ADJ]]
VERB DET NOUN [ADJ]``: adjectives move after their noun, determiners and adjectives agree with their noun's gender and
number, and the verb agrees in number with the subject's head noun, not with the noun inside the "near" phrase (the
attractor). Every target word is aligned to exactly one source word.
"""

import random
from dataclasses import dataclass

#: English noun → (French noun, gender).
NOUNS = {
    "cat": ("chat", "m"),
    "dog": ("chien", "m"),
    "book": ("livre", "m"),
    "bird": ("oiseau", "m"),
    "house": ("maison", "f"),
    "car": ("voiture", "f"),
    "key": ("clé", "f"),
    "table": ("table", "f"),
}
#: English adjective → (masculine, feminine) French forms.
ADJECTIVES = {"big": ("grand", "grande"), "small": ("petit", "petite"), "old": ("vieux", "vieille")}
#: English verb (singular, plural) → French (singular, plural).
VERBS = {
    ("sees", "see"): ("voit", "voient"),
    ("likes", "like"): ("aime", "aiment"),
    ("finds", "find"): ("trouve", "trouvent"),
}
DETERMINERS = {("the", "m", False): "le", ("the", "f", False): "la", ("the", "m", True): "les",
               ("the", "f", True): "les", ("a", "m", False): "un", ("a", "f", False): "une"}  # fmt: skip


@dataclass
class Example:
    """One sentence pair.

    Attributes:
        source: Source words.
        target: Target words.
        alignment: For each target word, the index of its source word.
        agreement: For each target word whose form depends on another source word (determiners, adjectives and
            verbs: the head noun they agree with), the index of that noun; None elsewhere.
    """

    source: list[str]
    target: list[str]
    alignment: list[int]
    agreement: list[int | None]


def _plural(noun: str) -> str:
    return noun if noun.endswith("s") else noun + "s"


def _noun_phrase(rng: random.Random, source: list[str], target: list[str], alignment, agreement, definite_only=False):
    """Append a noun phrase; return the source index of its noun and whether it is plural."""
    english = rng.choice(list(NOUNS))
    french, gender = NOUNS[english]
    plural = rng.random() < 0.4
    article = "the" if plural or definite_only or rng.random() < 0.6 else "a"
    adjective = rng.choice(list(ADJECTIVES)) if rng.random() < 0.4 else None
    det_index = len(source)
    source.append(article)
    adj_index = None
    if adjective:
        adj_index = len(source)
        source.append(adjective)
    noun_index = len(source)
    source.append(_plural(english) if plural else english)
    target.append(DETERMINERS[(article, gender, plural)])
    alignment.append(det_index)
    agreement.append(noun_index)
    target.append(_plural(french) if plural else french)
    alignment.append(noun_index)
    agreement.append(None)
    if adjective:
        form = ADJECTIVES[adjective][gender == "f"]
        target.append(_plural(form) if plural else form)
        alignment.append(adj_index)
        agreement.append(noun_index)
    return noun_index, plural


def sample(rng: random.Random, attractor_rate: float = 0.5) -> Example:
    """Draw one sentence pair."""
    source, target, alignment, agreement = [], [], [], []
    subject, plural = _noun_phrase(rng, source, target, alignment, agreement)
    if rng.random() < attractor_rate:
        source.append("near")
        target.append("près")
        alignment.append(len(source) - 1)
        agreement.append(None)
        _noun_phrase(rng, source, target, alignment, agreement, definite_only=True)
    english, french = rng.choice(list(VERBS.items()))
    source.append(english[plural])
    target.append(french[plural])
    alignment.append(len(source) - 1)
    agreement.append(subject)
    _noun_phrase(rng, source, target, alignment, agreement)
    return Example(source, target, alignment, agreement)


def vocabulary() -> list[str]:
    """Every word the grammar can produce, source and target (shared vocabulary)."""
    words = {"the", "a", "near", "près"} | set(DETERMINERS.values())
    for english, (french, _) in NOUNS.items():
        words |= {english, _plural(english), french, _plural(french)}
    for english, forms in ADJECTIVES.items():
        words |= {english, *forms, *map(_plural, forms)}
    for english, french in VERBS.items():
        words |= {*english, *french}
    return sorted(words)
