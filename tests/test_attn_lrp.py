"""AttnLRP: agreement with the rules written operation by operation on the real HF modules, conservation up to the
softmax rule's term, contrast, causality and chunking."""

import os

import pytest
import torch

from inseq_mixing.methods.attn_lrp import attn_lrp
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import tiny_model

from .conftest import example_kwargs, next_tokens
from .lxt_reference import LXT_FAMILIES, lxt_available, lxt_relevance
from .reference import naive_attn_lrp_gpt2, naive_attn_lrp_llama

NAIVE = {
    "gpt2": naive_attn_lrp_gpt2,
    "llama": naive_attn_lrp_llama,
    "mixtral": naive_attn_lrp_llama,
    "qwen2_moe": naive_attn_lrp_llama,  # a shared expert behind a sigmoid gate, a dense first layer
    "gpt_oss": naive_attn_lrp_llama,  # sinks, a sliding window, clamped experts with biases
}


def run(model, kwargs, ids, **options):
    return attn_lrp(
        model,
        get_spec(model),
        kwargs["input_ids"],
        kwargs.get("attention_mask"),
        kwargs.get("decoder_input_ids"),
        kwargs.get("decoder_attention_mask"),
        ids,
        **options,
    )


@pytest.mark.parametrize("family", sorted(NAIVE))
def test_matches_the_rules_applied_operation_by_operation(family):
    model = tiny_model(family)
    kwargs = example_kwargs(family)
    ids = next_tokens(kwargs)
    scores = run(model, kwargs, ids)
    for position in range(ids.shape[1]):
        relevance, logit, _ = NAIVE[family](model, kwargs["input_ids"][0], position, int(ids[0, position]))
        torch.testing.assert_close(scores.target[0, position], relevance, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(scores.logit[0, position], logit, atol=1e-5, rtol=1e-4)


def require_lxt() -> None:
    if lxt_available():
        return
    if os.environ.get("INSEQ_MIXING_REQUIRE_LXT"):
        pytest.fail("lxt is not installed, but INSEQ_MIXING_REQUIRE_LXT is set (the README test command installs it).")
    pytest.skip('lxt, the AttnLRP authors\' library, is not installed: pip install --no-deps "lxt==2.1"')


@pytest.mark.parametrize("family", sorted(LXT_FAMILIES))
def test_agrees_with_the_authors_library_lxt(family):
    """The authors' lxt rules on the same model give the same relevances (up to the ε of lxt's identity rule)."""
    require_lxt()
    model = tiny_model(family)
    kwargs = example_kwargs(family)
    ids = next_tokens(kwargs)
    before = model(**kwargs).logits
    relevance, logits = lxt_relevance(model, family, kwargs["input_ids"][0], ids[0])
    scores = run(model, kwargs, ids)
    torch.testing.assert_close(scores.target[0], relevance, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(scores.logit[0], logits, atol=1e-5, rtol=1e-4)
    plain, _ = lxt_relevance(model, family, kwargs["input_ids"][0], ids[0], rules=False)
    assert (plain - relevance).abs().max() > 1e-2  # lxt's rules were in force: they change the gradient
    torch.testing.assert_close(model(**kwargs).logits, before, atol=0, rtol=0)  # lxt's patches are undone
    with_sdpa = run(tiny_model(family, attn_implementation="sdpa"), kwargs, ids)  # ours does not need eager
    torch.testing.assert_close(with_sdpa.target[0], relevance, atol=1e-5, rtol=1e-4)


def test_without_biases_only_the_softmax_rule_absorbs_relevance():
    """A Llama has no biases or norm shifts: tokens get the whole logit but for the softmax rule's term."""
    model = tiny_model("llama")
    kwargs = example_kwargs("llama")
    ids = next_tokens(kwargs)
    scores = run(model, kwargs, ids)
    for position in (0, 3, 7):
        _, logit, absorbed = naive_attn_lrp_llama(model, kwargs["input_ids"][0], position, int(ids[0, position]))
        torch.testing.assert_close(scores.target[0, position].sum() + absorbed, logit, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(scores.absorbed[0, position], absorbed, atol=1e-5, rtol=1e-4)
    assert scores.absorbed.abs().min() > 1e-3  # the softmax rule does absorb (at position 0, half the attention's)


def test_relevance_is_not_gradient_times_input():
    """The rules change the gradient: plain Gradient×Input at the first block's input gives other scores."""
    model = tiny_model("gpt2")
    kwargs = example_kwargs("gpt2")
    ids = next_tokens(kwargs)
    scores = run(model, kwargs, ids)
    plain, _ = lxt_relevance(model, "gpt2", kwargs["input_ids"][0], ids[0], rules=False)  # needs no lxt
    assert not torch.allclose(plain[-1], scores.target[0, -1], atol=1e-3)


def test_contrast_is_the_difference_of_the_two_explanations(family):
    model = tiny_model(family)
    kwargs = example_kwargs(family)
    ids = next_tokens(kwargs)
    foils = (ids + 7) % 60 + 4
    contrast, plain, foil = run(model, kwargs, ids, foil_ids=foils), run(model, kwargs, ids), run(model, kwargs, foils)
    torch.testing.assert_close(contrast.target, plain.target - foil.target, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(contrast.logit, plain.logit - foil.logit, atol=1e-5, rtol=1e-4)
    if contrast.source is not None:
        torch.testing.assert_close(contrast.source, plain.source - foil.source, atol=1e-5, rtol=1e-4)


def test_every_family_gives_finite_causal_scores_and_its_own_logit(family):
    model = tiny_model(family)
    kwargs = example_kwargs(family, batch=2)
    ids = next_tokens(kwargs)
    scores = run(model, kwargs, ids)
    assert torch.isfinite(scores.target).all() and (scores.target.triu(1) == 0).all()
    with torch.no_grad():
        output = model(**kwargs)
    logits = output.logits if scores.logit_after_softcap is None else None
    if logits is not None:
        torch.testing.assert_close(scores.logit, logits.gather(-1, ids[..., None])[..., 0], atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(
            scores.logit_after_softcap, output.logits.gather(-1, ids[..., None])[..., 0], atol=1e-5, rtol=1e-5
        )
    assert scores.target.abs().sum() > 0 and (scores.source is None or scores.source.abs().sum() > 0)


def test_chunks_and_selected_positions_do_not_change_scores():
    model = tiny_model("marian")
    kwargs = example_kwargs("marian", batch=2)
    ids = next_tokens(kwargs)
    whole = run(model, kwargs, ids)
    positions = torch.zeros(ids.shape, dtype=torch.bool)
    positions[:, 2:] = True
    chunked = run(model, kwargs, ids, max_chunk_elements=1, positions=positions)
    torch.testing.assert_close(chunked.target[:, 2:], whole.target[:, 2:])
    torch.testing.assert_close(chunked.source[:, 2:], whole.source[:, 2:])
    assert (chunked.target[:, :2] == 0).all() and (chunked.logit[:, :2] == 0).all()


def test_the_model_is_left_as_it_was():
    model = tiny_model("llama")
    kwargs = example_kwargs("llama")
    with torch.no_grad():
        before = model(**kwargs).logits
    run(model, kwargs, next_tokens(kwargs))
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())
    assert all(param.grad is None for param in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(**kwargs).logits, before, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_inseqs_path_runs_attn_lrp_without_a_trace(family, monkeypatch):
    """AttnLRP runs passes of its own: through Inseq, no trace is recorded beside them (at 1,000 tokens its attention
    probabilities alone are 0.6 GB on a GPT-2-small-sized model), and the scores are those the traced call gives."""
    from inseq_mixing.declarations import Request
    from inseq_mixing.frontends.inseq_adapter.base import ContextMixingAttribution
    from inseq_mixing.testing import load_tiny

    model = load_tiny(family, "attn_lrp")
    source = "the cat sat on the mat"
    target = "le chat assis sur le tapis" if family == "marian" else f"{source} and the dog"
    with monkeypatch.context() as patched:  # the traced call, as before
        patched.setattr(Request, "model_call", lambda self: self.trace.call)
        traced = model.attribute(source, target, show_progress=False).sequence_attributions[0]

    def refuse(self, steps):
        raise AssertionError("AttnLRP traced a forward pass it does not read")

    monkeypatch.setattr(ContextMixingAttribution, "trace", refuse)
    untraced = model.attribute(source, target, show_progress=False).sequence_attributions[0]
    torch.testing.assert_close(untraced.target_attributions, traced.target_attributions, equal_nan=True)
    if traced.source_attributions is not None:
        torch.testing.assert_close(untraced.source_attributions, traced.source_attributions)


def test_a_span_in_one_backward_pass_equals_the_sum_of_its_tokens(family):
    """Our extension (one pass per span, after FlashTrace): the relevance of a span's summed logit equals the sum of
    its positions' relevances explained one by one (the rules pass relevance linearly), token relevances plus the
    absorbed part add up to the sum of the model's own logits (before a soft-cap), and each sentence's span is its
    own (two sentences, two different spans)."""
    from inseq_mixing.methods.attn_lrp import lrp_of_call, span_lrp_of_call
    from inseq_mixing.trace import ModelCall, forward_arguments

    model = tiny_model(family)
    spec = get_spec(model)
    kwargs = example_kwargs(family, batch=2)
    ids = next_tokens(kwargs)
    foils = (ids + 7) % 60 + 4
    positions = torch.zeros(ids.shape, dtype=torch.bool)
    positions[0, 1:4] = True
    positions[1, 2:] = True
    arguments = forward_arguments(model, spec, kwargs["input_ids"], kwargs.get("attention_mask"),
                                  kwargs.get("decoder_input_ids"), kwargs.get("decoder_attention_mask"))  # fmt: skip
    call = ModelCall(model, arguments)
    for foil_ids in (None, foils):
        each = lrp_of_call(spec, call, ids, foil_ids, positions, max_chunk_elements=2**26)
        span = span_lrp_of_call(spec, call, ids, foil_ids, positions)
        torch.testing.assert_close(span.target, each.target.sum(1), atol=1e-5, rtol=1e-4)
        if span.source is not None:
            torch.testing.assert_close(span.source, each.source.sum(1), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(span.logit, each.logit.sum(1), atol=1e-5, rtol=1e-5)
        total = span.target.sum(-1) + (0 if span.source is None else span.source.sum(-1)) + span.absorbed
        torch.testing.assert_close(total, span.logit, atol=1e-5, rtol=1e-5)
        assert span.target.abs().sum() > 0
