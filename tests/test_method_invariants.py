"""Invariants every plugin method inherits, through Inseq, over the table of registered methods: a padded batch (the
dataset runner's batched path) gives each sentence what it gets alone, future tokens never change past columns,
half precision runs, NaN weights are refused with a clear error, and a failed call leaves the model as it was."""

import pytest
import torch

import inseq_mixing
from inseq_mixing.frontends.generation import attribute_texts, split_arguments
from inseq_mixing.testing import is_seq2seq, load_tiny

FAMILIES = ("marian", "t5", "gpt2", "llama", "gemma2", "gpt_neox", "olmo2", "qwen2_moe")
SOURCES = ["the cat sat on the mat", "a dog"]
TARGETS = ["le chat assis sur le tapis", "un chien"]
PROMPTS = ["the cat sat", "a dog"]
TEXTS = ["the cat sat on the mat", "a dog sat on a mat"]


@pytest.fixture(params=inseq_mixing.METHODS)
def method(request):
    return request.param


@pytest.fixture(params=FAMILIES)
def tiny_family(request):
    return request.param


def texts(family: str) -> tuple[list[str], list[str]]:
    return (SOURCES, TARGETS) if is_seq2seq(family) else (PROMPTS, TEXTS)


def alone(model, family: str, source: str, target: str, **kwargs):
    if is_seq2seq(family):
        return model.attribute(source, target, attribute_target=True, show_progress=False, **kwargs)
    return model.attribute(source, target, show_progress=False, **kwargs)


def test_padded_batch_equals_each_sentence_alone(method, tiny_family):
    model = load_tiny(tiny_family, method)
    sources, targets = texts(tiny_family)
    inseq_args, options = split_arguments(model, {})
    batched = attribute_texts(model, sources, targets, inseq_args, options).sequence_attributions
    for seq, source, target in zip(batched, sources, targets, strict=True):
        single = alone(model, tiny_family, source, target).sequence_attributions[0]
        torch.testing.assert_close(
            seq.target_attributions, single.target_attributions, atol=1e-5, rtol=1e-4, equal_nan=True
        )
        if single.source_attributions is not None:
            torch.testing.assert_close(seq.source_attributions, single.source_attributions, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2"])
def test_future_tokens_do_not_change_past_columns(method, family):
    model = load_tiny(family, method)
    first = alone(model, family, "the cat", "the cat sat on the mat").sequence_attributions[0]
    second = alone(model, family, "the cat", "the cat sat on the dog").sequence_attributions[0]
    columns = first.target_attributions.shape[1]
    assert first.target_attributions[-1, : columns - 1].isnan().all()  # a column never sees its own or later tokens
    torch.testing.assert_close(
        first.target_attributions[:-1, : columns - 1], second.target_attributions[:-1, : columns - 1], equal_nan=True
    )


def test_bfloat16_runs_and_is_finite(method, tiny_family):
    model = load_tiny(tiny_family, method)
    model.model.to(torch.bfloat16)
    source, target = (part[0] for part in texts(tiny_family))
    seq = alone(model, tiny_family, source, target).sequence_attributions[0]
    values = seq.target_attributions[~seq.target_attributions.isnan()]
    assert values.numel() and torch.isfinite(values).all()


def test_nan_weights_are_refused_and_the_model_is_unchanged(method, tiny_family):
    model = load_tiny(tiny_family, method)
    hf_model = model.model
    with torch.no_grad():
        next(p for name, p in hf_model.named_parameters() if p.dim() == 2 and "embed" not in name)[0, 0] = float("nan")
    state = {name: value.clone() for name, value in hf_model.state_dict().items()}
    source, target = (part[0] for part in texts(tiny_family))
    with pytest.raises((ValueError, FloatingPointError), match="(?i)nan|non-finite|finite"):
        alone(model, tiny_family, source, target)
    for name, value in hf_model.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0, equal_nan=True)
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in hf_model.modules())


def test_a_failed_call_leaves_the_model_as_it_was(method, tiny_family):
    model = load_tiny(tiny_family, method)
    hf_model = model.model
    source, target = (part[0] for part in texts(tiny_family))
    expected = alone(model, tiny_family, source, target).sequence_attributions[0].target_attributions
    implementation, training = hf_model.config._attn_implementation, hf_model.training
    blocks = inseq_mixing.get_spec(hf_model).decoder.layers

    def fail(*_):
        raise RuntimeError("provoked")

    handle = blocks[-1].module.register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="provoked"):
            alone(model, tiny_family, source, target)
    finally:
        handle.remove()
    assert hf_model.config._attn_implementation == implementation and hf_model.training == training
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in hf_model.modules())
    again = alone(model, tiny_family, source, target).sequence_attributions[0].target_attributions
    torch.testing.assert_close(again, expected, rtol=0, atol=0, equal_nan=True)


# ----- the same invariants at the declarations' level, on every family and every option variant -----

from dataclasses import dataclass  # noqa: E402

from inseq_mixing.declarations import DECLARATIONS, Request  # noqa: E402
from inseq_mixing.methods.results import LogitScores  # noqa: E402
from inseq_mixing.specs import get_spec  # noqa: E402
from inseq_mixing.testing import ALL_FAMILIES  # noqa: E402
from inseq_mixing.trace import trace_model  # noqa: E402

from .conftest import get_tiny, pad_batch  # noqa: E402

SKIPPED_VARIANTS = {
    "output_encoder_self_scores",
    "max_chunk_elements",
    "contrast_targets",
    "contrast_targets_alignments",
}


def option_variants(name: str) -> list[dict]:
    """A method's default options, and each boolean option flipped and each choice set to its last value."""
    variants = [{}]
    for item in DECLARATIONS[name].option_fields():
        if item.name in SKIPPED_VARIANTS:
            continue
        choices = item.metadata.get("choices")
        if item.type is bool:
            variants.append({item.name: not item.default})
        elif choices and choices[-1] != item.default:
            variants.append({item.name: choices[-1]})
    return variants


VARIANTS = [(name, variant) for name in DECLARATIONS for variant in option_variants(name)]


@dataclass
class Requests:
    """A padded batch of sentences of different lengths, and each sentence alone, as method requests."""

    batched: Request
    alone: list[Request]
    spans: list[tuple[slice, slice]]  # (source positions, decoder positions) of each sentence in the batch


def request(model, ids, mask, target=None, target_mask=None, predicted=None) -> Request:
    decoder_mask = mask if target is None else target_mask
    return Request(get_spec(model), model, mask, target, target_mask, predicted, None, decoder_mask.bool(),
                   lambda: trace_model(model, ids, mask, target, target_mask))  # fmt: skip


def padded_requests(model, family: str, lengths=((6, 5), (3, 2)), seed: int = 3) -> Requests:
    """Right-padded sources and targets (encoder–decoders) or left-padded sequences (decoder-only), with each
    position's predicted token the sentence's next token (its last position: token 9)."""
    gen = torch.Generator().manual_seed(seed)
    sources = [torch.randint(4, 60, (s,), generator=gen) for s, _ in lengths]
    targets = [torch.cat([torch.tensor([0]), torch.randint(4, 60, (t - 1,), generator=gen)]) for _, t in lengths]
    decoder = targets if is_seq2seq(family) else sources
    nexts = [torch.cat([row[1:], torch.tensor([9])]) for row in decoder]
    left = not is_seq2seq(family)
    predicted, _ = pad_batch(nexts, left=left)
    if is_seq2seq(family):
        src, src_mask = pad_batch(sources, left=False)
        tgt, tgt_mask = pad_batch(targets, left=False)
        batched = request(model, src, src_mask, tgt, tgt_mask, predicted)
        alone = [request(model, s[None], torch.ones(1, len(s), dtype=torch.long), t[None],
                         torch.ones(1, len(t), dtype=torch.long), n[None])
                 for s, t, n in zip(sources, targets, nexts, strict=True)]  # fmt: skip
        return Requests(batched, alone, [(slice(0, s), slice(0, t)) for s, t in lengths])
    ids, mask = pad_batch(sources, left=True)
    width = ids.shape[1]
    alone = [request(model, s[None], torch.ones(1, len(s), dtype=torch.long), predicted=n[None])
             for s, n in zip(sources, nexts, strict=True)]  # fmt: skip
    return Requests(request(model, ids, mask, predicted=predicted), alone,
                    [(slice(width - s, width),) * 2 for s, _ in lengths])  # fmt: skip


def compute(name: str, variant: dict, req: Request):
    declaration = DECLARATIONS[name]
    return declaration.compute(req, declaration.make_options(variant))


def fields(result) -> dict[str, torch.Tensor]:
    """Token-by-token tensors of a result (``(B, [slots,] i, j)``), by name."""
    return {name: getattr(result, name) for name in ("target", "source", "encoder") if getattr(result, name, None)
            is not None}  # fmt: skip


def per_position(result) -> dict[str, torch.Tensor]:
    """Per-decoder-position tensors of a result (``(B, T, ...)``): a logit's terms, a map's extras."""
    if isinstance(result, LogitScores):
        values = {"logit": result.logit, **result.terms}
        return {name: value for name, value in values.items() if value is not None}
    return dict(result.positions)


@pytest.mark.parametrize(("name", "variant"), VARIANTS, ids=[f"{n}-{v}" for n, v in VARIANTS])
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_declared_method_on_every_family_pads_and_is_causal(name, variant, family):
    """Padding a sentence into a batch changes none of its scores (maps, logit scores and the terms completing the
    logit), and padding and future tokens get exactly zero, for every declaration, family and option variant."""
    model = get_tiny(family)
    case = padded_requests(model, family)
    batched = compute(name, variant, case.batched)
    for idx, (source, target) in enumerate(case.spans):
        alone = compute(name, variant, case.alone[idx])
        mine, theirs = fields(batched), fields(alone)
        assert mine.keys() == theirs.keys()
        cut = {"target": (target, target), "source": (target, source), "encoder": (source, source)}
        for key, value in theirs.items():
            rows, columns = cut[key]
            torch.testing.assert_close(mine[key][idx][..., rows, columns], value[0], atol=1e-5, rtol=1e-4)
        padding = torch.ones(mine["target"].shape[-1], dtype=torch.bool)
        padding[target] = False
        assert (mine["target"][idx][..., padding] == 0).all() and (mine["target"][idx][..., padding, :] == 0).all()
        if "source" in mine:
            assert (mine["source"][idx][..., source.stop :] == 0).all()
        for key, value in per_position(alone).items():
            torch.testing.assert_close(per_position(batched)[key][idx, target], value[0], atol=1e-5, rtol=1e-4)
    assert (fields(batched)["target"].triu(1) == 0).all(), "a position mixes in no later token"


@pytest.mark.parametrize(("name", "variant"), VARIANTS, ids=[f"{n}-{v}" for n, v in VARIANTS])
@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "olmo2"])
def test_every_declared_method_leaves_past_scores_unchanged_by_future_tokens(name, variant, family):
    model = get_tiny(family)
    ids = torch.randint(4, 60, (1, 8), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, -2:] = torch.tensor([40, 41])
    predicted = torch.cat([ids[:, 1:], torch.tensor([[9]])], dim=1)
    mask = torch.ones_like(ids)
    first = compute(name, variant, request(model, ids, mask, predicted=predicted))
    second = compute(name, variant, request(model, changed, mask, predicted=predicted))
    atol = 1e-5 if DECLARATIONS[name].explains_logit else 1e-6
    torch.testing.assert_close(first.target[..., :-2, :-2], second.target[..., :-2, :-2], rtol=0, atol=atol)


LOGIT_VARIANTS = [(name, variant) for name, variant in VARIANTS if DECLARATIONS[name].explains_logit]


@pytest.mark.parametrize(("name", "variant"), LOGIT_VARIANTS, ids=[f"{n}-{v}" for n, v in LOGIT_VARIANTS])
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_logit_method_is_complete_with_its_unattributed_terms(name, variant, family):
    """Token scores (over every slot) + the step scores named unattributed_* = the model's own logit (before a
    final soft-cap), at every real position of a padded batch: one completeness rule for every logit method."""
    case = padded_requests(get_tiny(family), family)
    result = compute(name, variant, case.batched)
    assert all(term.startswith("unattributed_") for term in result.terms)
    real = case.batched.decoder_mask.bool()
    if result.complete:
        torch.testing.assert_close(result.total()[real], result.logit[real].to(result.total().dtype), atol=1e-4,
                                   rtol=1e-4)  # fmt: skip
    else:  # DecompX per head: the heads' direct parts are not the whole logit, and say so
        assert name == "decompx" and variant.get("per_head")
    trace = case.batched.trace
    logits = trace.logits if trace.logits_before_softcap is None else trace.logits_before_softcap
    own = logits.gather(-1, case.batched.predicted_ids[..., None])[..., 0]
    torch.testing.assert_close(result.logit[real].float(), own[real].float(), atol=1e-4, rtol=1e-4)
