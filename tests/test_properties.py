"""Properties that must hold for every configuration, drawn at random with Hypothesis: family, depth, width, heads
and key/value heads, FFN size, sentence lengths, padding, dtype and method options.

- completeness: ALTI-logit's and DecompX's parts add up to the model's own logit;
- padding invariance: a padded batch gives each sentence's scores alone, for all four methods and AttnLRP (whose
  explained logit is also the model's own);
- causality: future tokens get exactly zero;
- rows that must sum to 1 do (value zeroing and ALTI maps, ALTI rollouts), and nothing is NaN;
- a call that fails half-way through the forward pass leaves the model bit-identical.

Example counts are small so the suite stays fast; ``HYPOTHESIS_PROFILE=ci`` (set by ``.ci/run``) draws the same
examples on every run, ``HYPOTHESIS_PROFILE=thorough`` draws ten times more.
"""

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from inseq_mixing.methods.alti import alti, alti_maps
from inseq_mixing.methods.alti_logit import alti_logit
from inseq_mixing.methods.attn_lrp import attn_lrp
from inseq_mixing.methods.decompx import BIAS_SPLITS, FFN_LINEARIZATIONS, GATED_SPLITS, DecompXOptions, decompx
from inseq_mixing.methods.value_zeroing import value_zeroing, value_zeroing_maps
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import ALL_FAMILIES, DECODER_FAMILIES, LLAMA_STYLE_FAMILIES, is_seq2seq, tiny_model
from inseq_mixing.trace import trace_model

from .conftest import pad_batch, padded_case

LLAMA_STYLE = LLAMA_STYLE_FAMILIES
#: Decoder-only families whose float64 forward gives NaN through left padding in transformers (all but GPT-2's own
#: attention code); they also take their softmax in float32.
NAN_WHEN_LEFT_PADDED_IN_FLOAT64 = tuple(family for family in DECODER_FAMILIES if family != "gpt2")
FLOAT32_INSIDE = NAN_WHEN_LEFT_PADDED_IN_FLOAT64


@dataclass
class Config:
    """One drawn configuration."""

    family: str
    layers: int
    heads: int
    head_dim: int
    kv_heads: int | None
    ffn: int
    lengths: tuple[tuple[int, int], ...]
    seed: int

    def case(self, dtype: torch.dtype):
        """The padded batch traced together and one by one. Most decoder-only models in float64 give NaN through
        padded rows in transformers (refused by the trace, see the test below), so they get one sentence there."""
        nan_padding = dtype == torch.float64 and self.family in NAN_WHEN_LEFT_PADDED_IN_FLOAT64
        lengths = self.lengths[:1] if nan_padding else self.lengths
        return padded_case(self.model(dtype), self.family, lengths, seed=self.seed)

    def model(self, dtype: torch.dtype = torch.float32, **kwargs) -> torch.nn.Module:
        model = tiny_model(
            self.family, d_model=self.heads * self.head_dim, layers=self.layers, heads=self.heads, ffn=self.ffn,
            seed=self.seed, kv_heads=self.kv_heads, **kwargs,
        )  # fmt: skip
        return model.to(dtype)


@st.composite
def configs(draw) -> Config:
    family = draw(st.sampled_from(ALL_FAMILIES))
    heads = draw(st.sampled_from([1, 2, 4]))
    kv_heads = draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0])) if family in LLAMA_STYLE else None
    length = st.tuples(st.integers(1, 7), st.integers(1, 6))
    return Config(
        family=family,
        layers=draw(st.integers(1, 3)),
        heads=heads,
        head_dim=draw(st.sampled_from([4, 8])),
        kv_heads=kv_heads,
        ffn=draw(st.sampled_from([8, 16, 32])),
        lengths=tuple(draw(st.lists(length, min_size=1, max_size=3))),
        seed=draw(st.integers(0, 2**16)),
    )


def predicted_ids(case) -> torch.Tensor:
    return case.next_ids()


def model_logits(trace, ids: torch.Tensor) -> torch.Tensor:
    """The model's own logit of ``ids`` at every decoder position, read from its output (before the final soft-cap
    of Gemma 2, the value the logit methods decompose)."""
    logits = trace.explained_logits
    return logits.gather(-1, ids[..., None].to(logits.device))[..., 0].double()


def parts_total(scores) -> torch.Tensor:
    total = scores.target.sum(-1).double()
    if scores.source is not None:
        total = total + scores.source.sum(-1).double()
    for term in getattr(scores, "unattributed", {}).values():
        total = total + term.double()
    if getattr(scores, "bias", None) is not None:
        total = total + scores.bias.double()
    return total


decompx_options = st.builds(
    DecompXOptions,
    bias=st.sampled_from(BIAS_SPLITS),
    ffn_linearization=st.sampled_from(FFN_LINEARIZATIONS),
    gated_split=st.sampled_from(GATED_SPLITS),
    include_ffn=st.booleans(),
)


@given(config=configs(), dtype=st.sampled_from([torch.float32, torch.float64]), options=decompx_options)
def test_logit_methods_add_up_to_the_models_logit(config, dtype, options):
    case = config.case(dtype)
    ids = predicted_ids(case)
    real = case.batched.decoder.mask
    logit = model_logits(case.batched, ids)
    # Llama-style RMSNorms and OPT's softmax round through float32 even in a float64 model (rows of attention
    # probabilities then sum to 1 only to float32 precision, which the value bias carried through W_O feels)
    tolerance = 1e-4 if dtype == torch.float32 else 1e-5 if config.family in FLOAT32_INSIDE else 1e-8
    scale = logit[real].abs().max().clamp(min=1.0)
    for scores in (alti_logit(case.batched, ids), decompx(case.batched, ids, options=options)):
        error = (parts_total(scores) - logit)[real].abs().max() / scale
        assert error <= tolerance, f"{type(scores).__name__}: relative error {float(error):.2e}"


def method_outputs(trace, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every method's scores over the decoder positions, as ``name → (B, [L,] T, tokens)``."""
    vz = value_zeroing(trace)
    outputs = {
        "value_zeroing target": vz.decoder,
        "alti rollout": alti_maps(alti(trace), rollout=True).target,
        "alti_logit target": alti_logit(trace, ids).target,
        "decompx target": decompx(trace, ids).target,
    }
    if trace.encoder is not None:
        outputs["value_zeroing source"] = vz.cross
        outputs["alti_logit source"] = alti_logit(trace, ids).source
        outputs["decompx source"] = decompx(trace, ids).source
    return outputs


@given(config=configs())
def test_padded_batch_equals_each_sentence_alone_and_future_tokens_get_zero(config):
    case = config.case(torch.float64)
    ids = predicted_ids(case)
    batched = method_outputs(case.batched, ids)
    for index, (source, target) in enumerate(case.spans):
        alone = method_outputs(case.alone[index], ids[index : index + 1, target])
        for name, scores in batched.items():
            keys = source if name.endswith("source") else target
            mine = scores[index][..., target, :][..., keys]
            torch.testing.assert_close(mine, alone[name][0].to(mine.dtype), atol=1e-9, rtol=1e-7, msg=name)
            if name.endswith("target"):
                future = torch.ones(mine.shape[-2:], dtype=torch.bool).triu(1)
                assert (mine[..., future] == 0).all(), f"{name}: a future token got a score"


@given(config=configs(), dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_rows_sum_to_one_and_nothing_is_nan(config, dtype):
    case = config.case(dtype)
    trace, real = case.batched, case.batched.decoder.mask
    maps = {
        "value_zeroing": value_zeroing_maps(value_zeroing(trace)).target,
        "alti layers": alti(trace).decoder,
        "alti rollout": alti_maps(alti(trace), rollout=True).target,
    }
    if trace.encoder is not None:
        maps["value_zeroing source"] = value_zeroing_maps(value_zeroing(trace)).source
        maps["alti+ rollout (source and target)"] = torch.cat(
            [alti_maps(alti(trace), rollout=True).source, maps.pop("alti rollout")], dim=-1
        )
    for name, scores in maps.items():
        assert not scores.isnan().any(), name
        rows = scores.sum(-1)  # (B, [L,] T)
        rows = rows.movedim(1, -1) if rows.ndim == 3 else rows[..., None]
        torch.testing.assert_close(rows[real], torch.ones_like(rows[real]), atol=1e-5, rtol=0, msg=name)
    ids = predicted_ids(case)
    for scores in (alti_logit(trace, ids), decompx(trace, ids)):
        assert torch.isfinite(scores.target).all() and torch.isfinite(parts_total(scores)).all()


@pytest.mark.parametrize("family", NAN_WHEN_LEFT_PADDED_IN_FLOAT64)
def test_float64_left_padding_nan_of_transformers_is_refused_with_the_reason(family):
    model = tiny_model(family, d_model=4, heads=1, kv_heads=1 if family in LLAMA_STYLE else None).double()
    with pytest.raises(FloatingPointError, match="left-padded batch in torch.float64.*one at a time"):
        padded_case(model, family, ((1, 1), (2, 1)))


class ProvokedFailure(RuntimeError):
    pass


@given(config=configs(), failing_layer=st.integers(0, 2), train=st.booleans())
def test_a_failed_trace_leaves_the_model_bit_identical(config, failing_layer, train):
    model = config.model(attn_implementation="sdpa")  # eager where the family has no sdpa (Gemma 2)
    implementation = model.config._attn_implementation
    model.train(train)
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    flags = [module.training for module in model.modules()]
    stack = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    blocks = next(child for child in stack.modules() if isinstance(child, torch.nn.ModuleList))
    block = blocks[min(failing_layer, len(blocks) - 1)]

    def fail(module, args):
        assert model.config._attn_implementation == "eager"  # the trace switched it...
        raise ProvokedFailure

    handle = block.register_forward_pre_hook(fail)
    try:
        ids = torch.tensor([[5, 6, 7]])
        with pytest.raises(ProvokedFailure):
            trace_model(model, ids, decoder_input_ids=ids if is_seq2seq(config.family) else None)
    finally:
        handle.remove()
    assert model.config._attn_implementation == implementation  # ...and restored it
    assert [module.training for module in model.modules()] == flags
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")
    assert not any(getattr(module, name) for module in model.modules() for name in hooks)
    assert all(torch.equal(weights[name], value) for name, value in model.state_dict().items())


def explained_of(ids: torch.Tensor) -> torch.Tensor:
    """A token to explain at each position, a function of the token there (so padding cannot change it)."""
    return (ids * 7 + 3) % 56 + 4


def lrp_kwargs(family: str, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """Model inputs for ``attn_lrp``: right-padded sources and targets, or left-padded sequences (the sources)."""
    if is_seq2seq(family):
        source, source_mask = pad_batch([source for source, _ in rows], left=False)
        target, target_mask = pad_batch([target for _, target in rows], left=False)
        return {"input_ids": source, "attention_mask": source_mask, "target_ids": target, "target_mask": target_mask}
    ids, mask = pad_batch([source for source, _ in rows], left=True)
    return {"input_ids": ids, "attention_mask": mask, "target_ids": None, "target_mask": None}


@given(config=configs())
def test_attn_lrp_padded_batch_equals_alone_is_causal_and_explains_the_models_logit(config):
    model = config.model()
    spec = get_spec(model)
    generator = torch.Generator().manual_seed(config.seed)
    rows = [
        (torch.randint(4, 60, (s,), generator=generator), torch.randint(4, 60, (t,), generator=generator))
        for s, t in config.lengths
    ]
    batch = lrp_kwargs(config.family, rows)
    decoder_ids = batch["target_ids"] if is_seq2seq(config.family) else batch["input_ids"]
    batched = attn_lrp(model, spec, **batch, explained_ids=explained_of(decoder_ids))
    for index, row in enumerate(rows):
        alone_kwargs = lrp_kwargs(config.family, [row])
        own_ids = alone_kwargs["target_ids"] if is_seq2seq(config.family) else alone_kwargs["input_ids"]
        alone = attn_lrp(model, spec, **alone_kwargs, explained_ids=explained_of(own_ids))
        real = (batch["target_mask"] if is_seq2seq(config.family) else batch["attention_mask"])[index].bool()
        mine = batched.target[index][real][:, real]
        torch.testing.assert_close(mine, alone.target[0], atol=1e-5, rtol=1e-4)
        assert (alone.target[0].triu(1) == 0).all()
        if alone.source is not None:
            source_real = batch["attention_mask"][index].bool()
            torch.testing.assert_close(
                batched.source[index][real][:, source_real], alone.source[0], atol=1e-5, rtol=1e-4
            )
        with torch.no_grad():
            forward = {"input_ids": alone_kwargs["input_ids"]}
            if is_seq2seq(config.family):
                forward["decoder_input_ids"] = own_ids
            logits = model(**forward).logits
        final = alone.logit if alone.logit_after_softcap is None else alone.logit_after_softcap
        own = logits.gather(-1, explained_of(own_ids)[..., None])[..., 0]
        torch.testing.assert_close(final, own, atol=1e-4, rtol=1e-4)
