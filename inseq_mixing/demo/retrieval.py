"""A synthetic retrieval task whose gold passage is known by construction, for the ``context`` protocol offline.

A prompt is a few passages, one per person, separated by blank lines, then a question about one of them (``"where does
alice live ?"``); the answer is that person's city (``" paris ."``). One passage says where that person lives (``"alice
lives in paris ."``); the others say what people like or play (``"bob likes tea ."``), and name no city; in half of the
prompts one of them is about the same person (``"alice plays chess ."``), a distractor that shares the question's name
but not its answer. The answer can come from one passage only: the gold passage (a needle among distractors: a model
answers by finding the one city of the prompt, no binding of people to cities needed). The demo model
(``scripts/train_retrieval_model.py``, saved in ``inseq_mixing/demo_retrieval_model``) is a small Llama-style model
trained on these prompts.
"""

import random
from dataclasses import dataclass

PEOPLE = ("alice", "bob", "carol", "dan", "eve", "frank", "grace", "heidi", "ivan", "judy")
CITIES = ("paris", "rome", "london", "berlin", "madrid", "oslo", "vienna", "lisbon", "prague", "dublin")
THINGS = {"likes": ("tea", "music", "books", "rain", "dogs"), "plays": ("chess", "tennis", "piano", "cards")}
#: What separates the passages (and the question) in a prompt.
SEPARATOR = "\n\n"


@dataclass
class RetrievalExample:
    """One row: the passages, the question, the answer and the gold passage's index."""

    passages: list[str]
    question: str
    answer: str
    gold: int

    @property
    def prompt(self) -> str:
        return prompt_of(self.passages, self.question)


def prompt_of(passages: list[str], question: str) -> str:
    """The prompt: the passages, then the question, separated by blank lines."""
    return SEPARATOR.join([*passages, question])


def vocabulary() -> list[str]:
    """Every word of the task."""
    things = [thing for options in THINGS.values() for thing in options]
    return [*PEOPLE, *CITIES, *THINGS, *things, "lives", "in", ".", "where", "does", "live", "?"]


def sample(rng: random.Random, passages: tuple[int, int] = (3, 5)) -> RetrievalExample:
    """One example with between ``passages[0]`` and ``passages[1]`` passages."""
    count = rng.randint(*passages)
    people, city, gold = rng.sample(PEOPLE, count), rng.choice(CITIES), rng.randrange(count)
    if rng.random() < 0.5:  # a distractor about the same person
        people[rng.choice([index for index in range(count) if index != gold])] = people[gold]
    texts = []
    for index, person in enumerate(people):
        if index == gold:
            texts.append(f"{person} lives in {city} .")
        else:
            verb = rng.choice(list(THINGS))
            texts.append(f"{person} {verb} {rng.choice(THINGS[verb])} .")
    return RetrievalExample(texts, f"where does {people[gold]} live ?", f" {city} .", gold)


def rows(count: int = 40, seed: int = 0) -> list[dict]:
    """Rows for ``evaluate(..., protocol="context")``: ``passages``, ``question``, ``answer`` and ``gold``."""
    rng = random.Random(seed)
    drawn = [sample(rng) for _ in range(count)]
    return [{"passages": e.passages, "question": e.question, "answer": e.answer, "gold": e.gold} for e in drawn]
