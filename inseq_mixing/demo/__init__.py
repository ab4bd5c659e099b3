"""The embedded demo: a small encoder–decoder trained on a synthetic grammar with known alignments (see
:mod:`.grammar` and ``scripts/train_demo_model.py``), shipped as package data, and its fixed examples. The report
comparing every method on it is :mod:`inseq_mixing.views.demo`'s. A second small model, trained on retrieval-style
prompts (:mod:`.retrieval`), is the offline demo of the ``context`` protocol."""

import random
from importlib.resources import files
from pathlib import Path

from .grammar import Example, sample

MODEL_DIR = files("inseq_mixing") / "demo_model"
#: The retrieval demo model (:mod:`.retrieval`, ``scripts/train_retrieval_model.py``): load it by the name
#: ``"demo-retrieval"`` (``inseq_mixing.load_model``, the command line) or from this folder.
RETRIEVAL_MODEL_DIR = files("inseq_mixing") / "demo_retrieval_model"


def load_demo_model():
    """The demo model and its tokenizer, from the package (no network)."""
    from transformers import AutoTokenizer, MarianMTModel

    path = str(MODEL_DIR)
    if not (Path(path) / "config.json").exists():
        raise FileNotFoundError(f"The demo model is missing from {path}: run scripts/train_demo_model.py.")
    return MarianMTModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def demo_examples(count: int = 6, seed: int = 7) -> list[Example]:
    """Fixed demo sentence pairs, half of them with an attractor ("near ...") before the verb."""
    rng = random.Random(seed)
    examples = []
    while len(examples) < count:
        example = sample(rng, attractor_rate=1.0 if len(examples) % 2 else 0.0)
        if len(example.source) <= 12:
            examples.append(example)
    return examples
