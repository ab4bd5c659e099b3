"""Host–device synchronisations in the method math, counted on the CPU (where each would stall a GPU): a patched
``Tensor.item`` / ``__bool__`` / ``__int__`` / ``__float__`` / ``tolist`` / ``nonzero``, boolean-mask indexing and
``torch.nonzero`` / ``torch.unique``. A declared method's ``compute`` on a traced batch must make a fixed, small
number of them, whatever the batch size and sequence length: no per-token or per-sentence Python loop that reads a
tensor's value can creep back in."""

import collections
import contextlib

import pytest
import torch

from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import tiny_encoder, tiny_model
from inseq_mixing.trace import trace_model

#: The most synchronisations one ``compute`` may make (today's largest is DecompX's 17 on GPT-2: its position blocks,
#: boolean selections and finite checks).
MOST_SYNCS = 20
TENSOR_METHODS = ("item", "__bool__", "__int__", "__float__", "tolist", "nonzero")
TORCH_FUNCTIONS = ("nonzero", "unique")


@contextlib.contextmanager
def counting_syncs():
    """Count the calls that read a tensor's values on the host, by kind."""
    counts = collections.Counter()
    patched = []

    def wrap(owner, name, counted):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if counted(args):
                counts[name] += 1
            return original(*args, **kwargs)

        patched.append((owner, name, original))
        setattr(owner, name, wrapper)

    def boolean_index(args):
        index = args[1] if len(args) > 1 else None
        items = index if isinstance(index, tuple) else (index,)
        return any(isinstance(item, torch.Tensor) and item.dtype == torch.bool for item in items)

    try:
        for name in TENSOR_METHODS:
            wrap(torch.Tensor, name, lambda args: True)
        for name in TORCH_FUNCTIONS:
            wrap(torch, name, lambda args: True)
        wrap(torch.Tensor, "__getitem__", boolean_index)
        yield counts
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def syncs_of(model, method: str, batch: int, length: int) -> int:
    ids = torch.randint(5, 60, (batch, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones_like(ids)
    spec = get_spec(model)
    trace = trace_model(model, ids, mask, spec=spec)
    explained = torch.zeros_like(ids) if spec.is_encoder_only else torch.roll(ids, -1, 1)  # a label, or the next token
    request = Request(spec, model, ids, mask, None, None, explained, None, mask.bool(), lambda: trace)
    declaration = DECLARATIONS[method]
    with counting_syncs() as counts:
        declaration.compute(request, declaration.options())
    return sum(counts.values())


@pytest.fixture(scope="module")
def models():
    return {"gpt2": tiny_model("gpt2"), "bert": tiny_encoder("bert", "sequence_classification")}


@pytest.mark.parametrize("method", list(DECLARATIONS))
@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_the_math_makes_a_fixed_small_number_of_syncs(models, kind, method):
    counts = {(batch, length): syncs_of(models[kind], method, batch, length) for batch in (1, 4) for length in (6, 14)}
    assert len(set(counts.values())) == 1, counts  # the same for every batch size and length
    assert next(iter(counts.values())) <= MOST_SYNCS, counts


def test_the_counter_sees_what_it_counts():
    with counting_syncs() as counts:
        values = torch.arange(5.0)
        bool(values.sum() > 0), values.tolist(), values[values > 2], torch.nonzero(values)
    assert counts == {"__bool__": 1, "tolist": 1, "__getitem__": 1, "nonzero": 1}


@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_the_batch_path_syncs_do_not_grow_with_length(family):
    """A dataset batch through Inseq (token strings included: Inseq's tokenizer call would read device ids one by
    one) makes as many synchronisations for 10-word texts as for 5-word ones."""
    from inseq_mixing.runs.runner import attribute_texts, split_arguments
    from inseq_mixing.testing import WORDS, is_seq2seq, load_tiny

    model = load_tiny(family, "alti_logit")
    inseq_args, options = split_arguments(model, {})
    generator = torch.Generator().manual_seed(0)

    def words(count: int) -> str:
        return " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (count,), generator=generator))

    def batch_syncs(count: int) -> int:
        sources = [words(count) for _ in range(4)]
        targets = [words(count) if is_seq2seq(family) else f"{source} {words(count)}" for source in sources]
        with counting_syncs() as counts:
            attribute_texts(model, sources, targets, inseq_args, options)
        return sum(counts.values())

    batch_syncs(3)  # first-call work
    assert batch_syncs(5) == batch_syncs(10)
