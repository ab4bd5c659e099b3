"""Mixtures of experts: each mixture, decomposed with the routing the trace froze, adds up to the block's own output;
the decomposition reads that routing; transformers' experts kernels leave every method's scores as they are."""

import inseq
import pytest
import torch
import transformers

import inseq_mixing
from inseq_mixing.methods.decompx import DecompXOptions, decompose_mixture, decompx, mixture_weights
from inseq_mixing.methods.decompx_plan import Components
from inseq_mixing.runs import attribute_dataset
from inseq_mixing.specs import NOT_YET_EXPLAINED, get_spec
from inseq_mixing.specs.base import MoESpec, UnsupportedModelError
from inseq_mixing.testing import MOE_FAMILIES, load_tiny, tiny_model, word_tokenizer

from .conftest import assert_a_killed_run_resumes, example_kwargs, get_tiny, next_tokens, trace_of

OPTIONS = {
    "default": DecompXOptions(),
    "tangent, gate branch": DecompXOptions(ffn_linearization="tangent", gated_split="gate", bias="norm"),
}


@pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_decompx_parts_of_each_mixture_add_up_to_its_output(family, options):
    """Three random components of a mixture's recorded input, decomposed through the experts the router chose at the
    traced pass (weighted by its weights, plus the shared expert and its gate), sum to the block's own output; each
    component gets a part of its own (the decomposition is not a split of the output)."""
    model = get_tiny(family)
    trace = trace_of(model, example_kwargs(family, batch=2))
    mixtures = [(spec, record) for spec, record in zip(trace.spec.decoder.layers, trace.decoder.layers, strict=True)
                if isinstance(spec.ffn, MoESpec)]  # fmt: skip
    assert mixtures
    generator = torch.Generator().manual_seed(0)
    for spec, record in mixtures:
        moe = spec.ffn
        hidden = record.ffn_norm_input if moe.in_norm is None else moe.in_norm(record.ffn_norm_input)
        parts = torch.randn(*hidden.shape[:2], 3, hidden.shape[-1], generator=generator)
        parts[:, :, -1] = hidden - parts[:, :, :-1].sum(2)
        inputs = Components(parts, torch.ones(parts.shape[:3], dtype=torch.bool), None)
        mix = mixture_weights(moe, record.ffn_routing, record.ffn_norm_input)
        assert ((mix[..., :-1] > 0).sum(-1) == moe.top_k).all()
        out = decompose_mixture(moe, inputs, mix, options)
        torch.testing.assert_close(out.sum(2), moe.forward(hidden), atol=1e-5, rtol=1e-5)
        assert (out[:, :, 0] - out[:, :, 1]).abs().max() > 1e-3


def test_transformers_experts_kernels_give_the_same_scores():
    """The model as transformers loads it (its batched-matmul experts kernel) gives every method's scores of the
    loop over experts the tests use: value zeroing re-runs the kernel, AttnLRP's rules reach the experts inside it."""
    model = tiny_model("qwen2_moe")
    kernel = tiny_model("qwen2_moe")
    kernel.set_experts_implementation("grouped_mm")
    assert kernel.config._experts_implementation == "grouped_mm"
    tokenizer = word_tokenizer(seq2seq=False)
    for method in inseq_mixing.METHODS:
        scores = []
        for each in (model, kernel):
            loaded = inseq.load_model(each, method, tokenizer=tokenizer)
            out = loaded.attribute("the cat sat", "the cat sat on the mat", show_progress=False)
            scores.append(out.sequence_attributions[0].target_attributions)
        torch.testing.assert_close(scores[1], scores[0], atol=1e-5, rtol=1e-4, equal_nan=True, msg=method)


def test_decompx_reads_the_routing_the_trace_recorded():
    """The decomposition takes the routing from the trace (the model's own at its pass), not from a router run again
    on its float sums: other experts recorded at one position change the scores from that position on, and nothing
    before it."""
    kwargs = example_kwargs("mixtral")
    ids = next_tokens(kwargs)
    trace = trace_of(get_tiny("mixtral"), kwargs)
    before = decompx(trace, ids).target
    weights, experts = trace.decoder.layers[0].ffn_routing
    experts[0, 3] = (experts[0, 3] + 1) % 4  # other experts at position 3 of the first layer
    after = decompx(trace, ids).target
    torch.testing.assert_close(after[0, :3], before[0, :3], atol=1e-6, rtol=1e-6)  # experts batched otherwise
    assert (after[0, 3:] - before[0, 3:]).abs().max() > 1e-3


def test_half_precision_runs_close_to_float32():
    kwargs = example_kwargs("mixtral", batch=2)
    ids = next_tokens(kwargs)
    full = decompx(trace_of(get_tiny("mixtral"), kwargs), ids)
    half = decompx(trace_of(tiny_model("mixtral").to(torch.bfloat16), kwargs), ids)
    assert half.target.dtype == torch.float32 and torch.isfinite(half.target).all()
    assert (half.target - full.target).abs().max() < 0.1 * full.logit.abs().max()


def test_load_tiny_builds_every_mixture():
    for family in MOE_FAMILIES:
        assert load_tiny(family, "alti").model.config.model_type == tiny_model(family).config.model_type


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ("DeepseekV32Config", "sparse token selector"),
        ("GraniteMoeSWAConfig", "sinks that scale the attention output after the softmax"),
        ("MllamaConfig", "cross-attention layers that read the vision tower"),
    ],
)
def test_architectures_not_yet_explained_are_refused_with_the_reason(config, reason):
    model_type = getattr(transformers, config).model_type
    model = torch.nn.Module()
    model.config = type("Config", (), {"model_type": model_type})()
    with pytest.raises(UnsupportedModelError, match=f"not explained yet: .*{reason}"):
        get_spec(model)
    assert model_type in NOT_YET_EXPLAINED


@pytest.mark.parametrize(
    ("family", "method"),
    [
        ("deepseek_v3", "decompx"),
        ("bamba", "alti_logit"),
        ("qwen3_next", "value_zeroing"),
        ("falcon_h1", "alti"),
        ("zamba2", "decompx"),
    ],
)
def test_a_dataset_run_of_a_mixture_or_hybrid_killed_mid_run_resumes_to_the_uninterrupted_one(
    family, method, tmp_path, monkeypatch
):
    """A dataset run of a mixture of experts (DeepSeek-V3's latent attention and routing) or of a hybrid (Bamba's
    Mamba-2 layers; Qwen3-Next's Gated DeltaNet, gated attention and experts; Falcon-H1's parallel Mamba-2 mixer and
    attention; Zamba 2's shared attention blocks over the embeddings), killed after its first shard, resumes to the
    rows of an uninterrupted run, bit for bit."""
    model = load_tiny(family, method)
    prompts = ["the cat", "a dog sat", "she read", "good morning", "hello"]
    rows = [{"id": f"r{i}", "source": prompt, "target": f"{prompt} on the mat"} for i, prompt in enumerate(prompts)]

    def run(out):
        return attribute_dataset(model, method, rows, out, batch_size=2, show_progress=False, id_column="id")

    assert_a_killed_run_resumes(run, tmp_path, len(rows), monkeypatch)


@pytest.mark.parametrize(("method", "units"), [("attention_rollout", "tokens"), ("attention_rollout", "sentences"),
                                               ("attention_flow", "tokens")])  # fmt: skip
def test_rollout_and_flow_say_where_a_sink_s_share_went(method, units):
    """GPT-OSS's learned sinks take part of every attention row and pass nothing on: a span's rolled-out (or flow) row
    over the prompt's units and the share ``sink_share`` that went to the sinks add up to 1, and that share is not
    nothing; a model without sinks has no such share and its span rows sum to 1."""
    prompt, answer = "the cat sat on the mat . the dog ran .", " she read a book"
    for family in ("gpt_oss", "llama"):
        model = load_tiny(family, method)
        out = model.attribute(prompt, prompt + answer, spans="answer", units=units, show_progress=False)
        sequence = out.sequence_attributions[0]
        total = sequence.source_attributions.sum(0)
        if family == "gpt_oss":
            share = sequence.step_scores["sink_share"]
            assert float(share.min()) > 1e-3
            torch.testing.assert_close(total + share, torch.ones_like(total))
        else:
            assert "sink_share" not in sequence.step_scores
            torch.testing.assert_close(total, torch.ones_like(total))
