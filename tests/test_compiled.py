"""``compile=True``: the hot steps run as torch.compile kernels (the compiled functions are the ones called) and give
the eager results up to float rounding, through the declarations and through Inseq."""

import pytest
import torch

from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.methods import compiled
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import is_seq2seq, load_tiny

from .conftest import example_kwargs, get_tiny, trace_of

#: Which methods offer the option (the others have no step a compiler fuses).
COMPILED_METHODS = ["alti", "alti_logit", "decompx", "value_zeroing"]


def test_the_option_is_declared_by_the_methods_with_a_hot_step():
    assert [name for name, d in DECLARATIONS.items() if "compile" in d.option_names()] == sorted(COMPILED_METHODS)


def request_for(family: str) -> Request:
    model = get_tiny(family)
    kwargs = example_kwargs(family)
    trace = trace_of(model, kwargs, full_logits=False)
    decoder = kwargs.get("decoder_input_ids", kwargs["input_ids"])
    mask = trace.decoder.mask
    seq2seq = is_seq2seq(family)
    return Request(get_spec(model), model, kwargs.get("attention_mask", mask.long()),
                   decoder if seq2seq else None, mask.long() if seq2seq else None, torch.roll(decoder, -1, 1), None,
                   mask, lambda: trace)  # fmt: skip


@pytest.mark.parametrize(("family", "method"), [("gpt2", "value_zeroing"), ("marian", "value_zeroing"),
                                                ("gpt2", "alti_logit"), ("marian", "decompx")])  # fmt: skip
def test_compiled_steps_run_and_equal_eager(family, method, monkeypatch):
    declaration = DECLARATIONS[method]
    eager = declaration.run(request_for(family), declaration.make_options({}))
    called = []
    compile_ = torch.compile

    def counting_compile(function, **kwargs):
        inner = compile_(function, **kwargs)

        def wrapper(*args):
            called.append(function.__name__)
            return inner(*args)

        return wrapper

    monkeypatch.setattr(torch, "compile", counting_compile)
    monkeypatch.setattr(compiled, "_COMPILED", {})
    fast = declaration.run(request_for(family), declaration.make_options({"compile": True}))
    assert called  # the compiled kernels did the work
    assert compiled.kernel(torch.add) is torch.add  # and only inside the call
    for name in ("target", "source", "encoder"):
        expected = getattr(eager, name, None)
        if expected is not None:
            torch.testing.assert_close(getattr(fast, name), expected, rtol=1e-4, atol=1e-5)


def test_compile_through_inseq():
    model = load_tiny("gpt2", "value_zeroing")
    eager = model.attribute("the cat sat", "the cat sat on the mat", show_progress=False)
    fast = model.attribute("the cat sat", "the cat sat on the mat", compile=True, show_progress=False)
    torch.testing.assert_close(fast.sequence_attributions[0].target_attributions,
                               eager.sequence_attributions[0].target_attributions, rtol=1e-4, atol=1e-5,
                               equal_nan=True)  # fmt: skip
