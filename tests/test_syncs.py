"""Host–device synchronisations in the method math, counted on the CPU (where each would stall a GPU): a patched
``Tensor.item`` / ``__bool__`` / ``__int__`` / ``__float__`` / ``tolist`` / ``nonzero``, a copy to the host
(``Tensor.cpu``, ``Tensor.to("cpu")``), boolean-mask indexing and ``torch.nonzero`` / ``torch.unique``. Work on
the host copy itself (NumPy) is not counted: a device tensor cannot be read as a NumPy array without one of these. A
declared method's ``compute`` on a traced batch must make a fixed, small number of them, whatever the batch size and
sequence length: no per-token or per-sentence Python loop that reads a tensor's value can creep back in."""

import collections
import contextlib
import pathlib
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from inseq_mixing import deferred
from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.frontends.patches import HostCopies
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import tiny_encoder, tiny_model
from inseq_mixing.trace import trace_model

#: The most synchronisations one ``compute`` may make.
MOST_SYNCS = 10
#: The most one ``Declaration.run`` (the traced forward pass included) may make: the vocabulary check before the
#: forward pass, the left-padding decision, one read of all the deferred checks (finite scores and forward pass,
#: ALTI's empty rows), and one of the method's own (value zeroing's first explained row, AttnLRP's relevance seed,
#: DecompX's copy of the masks its layout is found from).
MOST_SYNCS_PER_RUN = 4
TENSOR_METHODS = ("item", "__bool__", "__int__", "__float__", "tolist", "nonzero", "cpu")
TORCH_FUNCTIONS = ("nonzero", "unique")
OUR_FILES = str(pathlib.Path(deferred.__file__).parent)


@contextlib.contextmanager
def counting_syncs(ours_only: bool = False):
    """Count the calls that read a tensor's values on the host, by kind; with ``ours_only``, only those made by this
    package's code (not inside transformers' forward pass)."""
    counts = collections.Counter()
    patched = []
    unwrapped = {}  # each wrapper's original: the mode below is handed the wrapper again, already counted

    def wrap(owner, name, counted):
        original, own = getattr(owner, name), name in vars(owner)  # inherited: the C base's (Tensor.item)

        def wrapper(*args, **kwargs):
            if counted(args, kwargs) and (not ours_only or OUR_FILES in sys._getframe(1).f_code.co_filename):
                counts[name] += 1
            return original(*args, **kwargs)

        patched.append((owner, name, original, own))
        unwrapped[wrapper] = original
        setattr(owner, name, wrapper)

    def boolean_index(args, kwargs):
        index = args[1] if len(args) > 1 else None
        items = index if isinstance(index, tuple) else (index,)
        return any(isinstance(item, torch.Tensor) and item.dtype == torch.bool for item in items)

    def to_host(args, kwargs):  # to("cpu"), to(device="cpu"); not to(x.device): on a GPU, x's own device
        return any(
            isinstance(target, str) and target.startswith("cpu") for target in [*args[1:], kwargs.get("device")]
        )

    class BooleanIndexing(TorchFunctionMode):
        """Boolean-mask indexing, seen as a torch function: a ``__getitem__`` set on ``torch.Tensor`` would stay in its
        type's sequence slot once taken back, and a 0-d tensor would then read as a sequence to ``torch.tensor``."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.__getitem__ and boolean_index(args, kwargs):
                if not ours_only or OUR_FILES in sys._getframe(1).f_code.co_filename:
                    counts["__getitem__"] += 1
            return unwrapped.get(func, func)(*args, **kwargs)

    try:
        for name in TENSOR_METHODS:
            wrap(torch.Tensor, name, lambda args, kwargs: True)
        for name in TORCH_FUNCTIONS:
            wrap(torch, name, lambda args, kwargs: True)
        wrap(torch.Tensor, "to", to_host)
        with BooleanIndexing():
            yield counts
    finally:
        for owner, name, original, own in reversed(patched):  # an inherited one is deleted, not set on the class
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


def syncs_of(model, method: str, batch: int, length: int, with_trace: bool = False) -> int:
    """Synchronisations of the method's ``compute`` on a traced batch, or (``with_trace``) those this package makes in
    its whole ``run``: the traced forward pass, the math and the deferred checks."""
    ids = torch.randint(5, 60, (batch, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones_like(ids)
    spec = get_spec(model)
    traced = None if with_trace else trace_model(model, ids, mask, spec=spec)
    explained = torch.zeros_like(ids) if spec.is_encoder_only else torch.roll(ids, -1, 1)  # a label, or the next token

    def tracer():
        return traced or trace_model(model, ids, mask, spec=spec)

    request = Request(spec, model, mask, None, None, explained, None, mask.bool(), tracer)
    declaration = DECLARATIONS[method]
    with counting_syncs(ours_only=with_trace) as counts:
        (declaration.run if with_trace else declaration.compute)(request, declaration.options())
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


@pytest.mark.parametrize("method", list(DECLARATIONS))
@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_a_whole_run_reads_the_device_a_few_times(models, kind, method):
    """Trace, math and every finite check: the checks are read back together at the end of the run, once."""
    counts = {
        (batch, length): syncs_of(models[kind], method, batch, length, True) for batch in (1, 4) for length in (6, 14)
    }
    assert len(set(counts.values())) == 1, counts
    assert next(iter(counts.values())) <= MOST_SYNCS_PER_RUN, counts


@pytest.fixture(scope="module")
def deeper():
    return tiny_model("gpt2", layers=4)


@pytest.mark.parametrize("method", list(DECLARATIONS))
def test_the_syncs_do_not_grow_with_the_number_of_layers(models, deeper, method):
    """What is read from the device (layouts, checks) is read once per run, not once per layer."""
    assert syncs_of(models["gpt2"], method, 4, 14, True) == syncs_of(deeper, method, 4, 14, True)


def test_deferred_checks_act_in_order_after_one_read():
    seen = []
    with counting_syncs() as counts, deferred.one_read():
        for value in (3, 0, 5):
            deferred.check(torch.tensor(value), seen.append)
        deferred.check(torch.tensor(True), seen.append)
        assert seen == []  # nothing read yet
    assert seen == [3, 0, 5, 1]
    assert counts == {"tolist": 1}
    deferred.check(torch.tensor(7), seen.append)  # outside a scope: at once
    assert seen[-1] == 7


def test_a_deferred_failure_raises_first_and_explains_a_later_error():
    def refuse(name):
        def act(finite):
            if not finite:
                raise FloatingPointError(name)

        return act

    with pytest.raises(FloatingPointError, match="^second$"):
        with deferred.one_read():
            deferred.check(torch.tensor(True), refuse("first"))
            deferred.check(torch.tensor(False), refuse("second"))
            deferred.check(torch.tensor(False), refuse("third"))
    with pytest.raises(FloatingPointError, match="^nan$") as caught:
        with deferred.one_read():
            deferred.check(torch.isfinite(torch.tensor(float("nan"))), refuse("nan"))
            raise IndexError("what the NaN caused downstream")
    assert isinstance(caught.value.__cause__, IndexError)
    with pytest.raises(IndexError):  # the checks pass: the original error stands
        with deferred.one_read():
            deferred.check(torch.tensor(True), refuse("fine"))
            raise IndexError("unrelated")


def test_refused_scores_still_raise_through_a_run(models):
    """A non-finite score made inside ``Declaration.run`` raises when the run ends, with the method's message."""
    model = models["gpt2"]
    ids = torch.randint(5, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    spec = get_spec(model)
    trace = trace_model(model, ids, mask, spec=spec)
    trace.decoder.layers[1].self_attn.values[0, 2, 0, 0] = float("nan")
    request = Request(spec, model, mask, None, None, torch.roll(ids, -1, 1), None, mask.bool(), lambda: trace)
    declaration = DECLARATIONS["alti"]
    with pytest.raises(FloatingPointError, match="ALTI produced non-finite scores"):
        declaration.run(request, declaration.options())


def test_token_strings_read_each_batch_tensor_once():
    """Inseq converts a batch's ids row by row (and token by token): each row is read from one host copy of the
    batch tensor, equal to reading it alone."""
    ids = torch.randint(0, 1000, (5, 9), generator=torch.Generator().manual_seed(0))
    copies = HostCopies()
    with counting_syncs() as counts:
        rows = [copies.values(row) for row in ids]
        runs = [copies.values(ids[row, start : start + 3]) for row in range(5) for start in (0, 4, 6)]
    assert counts == {"tolist": 1}
    assert rows == ids.tolist()
    assert runs == [ids[row, start : start + 3].tolist() for row in range(5) for start in (0, 4, 6)]
    ids[0, 0] += 1  # changed in place: read again
    assert copies.values(ids[0]) == ids[0].tolist()
    column = ids[:, 2]  # a view that is not a run of a row: read alone
    assert copies.values(column) == column.tolist()


def test_the_counter_sees_what_it_counts():
    with counting_syncs() as counts:
        values = torch.arange(5.0)
        bool(values.sum() > 0), values.tolist(), values[values > 2], torch.nonzero(values)
        values.cpu(), values.to("cpu"), values.to("cpu", torch.float64), values.to(device="cpu")
        values.to(torch.float64), values.to(values.device)  # a dtype, or the device the math runs on: no host copy
    assert counts == {"__bool__": 1, "tolist": 1, "__getitem__": 1, "nonzero": 1, "cpu": 1, "to": 3}


@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_the_batch_path_syncs_do_not_grow_with_length(family):
    """A dataset batch through Inseq (token strings included: Inseq's tokenizer call would read device ids one by
    one) makes as many synchronisations for 10-word texts as for 5-word ones."""
    from inseq_mixing.frontends.generation import attribute_texts, split_arguments
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


def test_host_copies_read_several_masks_at_once():
    """DecompX's masks (boolean, integer) come back to the host in one copy, each with its values, shape and dtype."""
    from inseq_mixing.methods.blocks import host_copies

    masks = [torch.tensor([[1, 1, 0], [1, 0, 0]]), torch.tensor([[True, False]]), torch.arange(6).reshape(3, 2)]
    with counting_syncs() as counts:
        copies = host_copies(*masks)
    assert counts == {"cpu": 1}
    for copy, mask in zip(copies, masks, strict=True):
        assert copy.dtype == mask.dtype and torch.equal(copy, mask)
