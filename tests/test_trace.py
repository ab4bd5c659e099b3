"""The trace: records match the model, and a failed call leaves the model exactly as it was."""

import itertools

import pytest
import torch

import inseq_mixing.methods.value_zeroing as vz_math
from inseq_mixing.methods.blocks import cross_attention_input, finish_layer
from inseq_mixing.methods.norms import freeze_norm
from inseq_mixing.specs import get_spec
from inseq_mixing.specs.base import MoESpec
from inseq_mixing.testing import is_seq2seq, load_tiny, tiny_model
from inseq_mixing.trace import trace_model

from .conftest import example_kwargs, get_tiny, trace_of, traced_stacks


def forward_logits(model, kwargs):
    with torch.no_grad():
        return model(**kwargs).logits


def all_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_blocks_recompose_every_layer(family):
    """Re-applying each block's position-wise rest with the spec reproduces the HF layer outputs exactly."""
    model = get_tiny(family)
    kwargs = example_kwargs(family)
    trace = trace_of(model, kwargs)
    for stack_spec, stack in traced_stacks(trace):
        assert len(stack.layers) == len(stack_spec.layers)
        for layer, record in zip(stack_spec.layers, stack.layers, strict=True):
            index = torch.arange(record.input.shape[0])
            out = finish_layer(layer, record, "self", record.input, record.self_attn.output, index, slice(None))
            torch.testing.assert_close(out, record.output, rtol=0, atol=1e-6)
            if record.cross_attn is not None:
                residual = cross_attention_input(layer, record)
                out = finish_layer(layer, record, "cross", residual, record.cross_attn.output, index, slice(None))
                torch.testing.assert_close(out, record.output, rtol=0, atol=1e-6)
            probs = record.self_attn.probs
            if hasattr(layer.self_attn.module, "sinks"):  # a learned sink takes the rest of every row (GPT-OSS)
                assert ((probs.sum(-1) < 1) & (probs.sum(-1) > 0)).all()
            else:
                torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    torch.testing.assert_close(trace.logits, forward_logits(model, {**kwargs, "use_cache": False}))


def test_hooks_removed_and_model_unchanged_after_failure_inside_forward(family):
    model = tiny_model(family, attn_implementation="sdpa")
    implementation = model.config._attn_implementation  # sdpa, or eager where the family has no sdpa
    kwargs = {**example_kwargs(family), "use_cache": False}
    before = forward_logits(model, kwargs)  # tiny_model returns the model in eval mode
    model.train()
    hooks_before = all_hooks(model)
    spec = get_spec(model)
    failing = spec.decoder.layers[-1].module.register_forward_hook(
        lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))
    )
    with pytest.raises(RuntimeError, match="boom"):
        trace_of(model, kwargs, spec=spec)
    failing.remove()
    assert all_hooks(model) == hooks_before
    assert model.training and all(m.training for m in model.modules())
    assert model.config._attn_implementation == implementation
    model.eval()
    assert torch.equal(before, forward_logits(model, kwargs))


def test_model_unchanged_after_failure_inside_method(monkeypatch):
    model = load_tiny("marian", "value_zeroing")
    hf = model.model
    kwargs = {**example_kwargs("marian"), "use_cache": False}
    before = forward_logits(hf, kwargs)
    hooks_before = all_hooks(hf)

    def explode(*args, **kwargs):
        raise RuntimeError("failure half way")

    monkeypatch.setattr(vz_math, "zeroing_distances", explode)
    with pytest.raises(RuntimeError, match="half way"):
        model.attribute("the books", "les livres", attribute_target=True, show_progress=False)
    assert all_hooks(hf) == hooks_before
    assert torch.equal(before, forward_logits(hf, kwargs))
    monkeypatch.undo()
    out = model.attribute("the books", "les livres", attribute_target=True, show_progress=False)
    assert out.sequence_attributions[0].source_attributions is not None


@pytest.mark.parametrize("family", ["marian", "gpt2"])
def test_empty_input_is_refused(family):
    model = get_tiny(family)
    empty = torch.zeros(1, 0, dtype=torch.long)
    with pytest.raises(ValueError, match="empty"):
        if is_seq2seq(family):
            trace_model(model, torch.tensor([[5, 1]]), decoder_input_ids=empty)
        else:
            trace_model(model, empty)


def test_value_projection_spec_reproduces_recorded_values(family):
    """The spec's W_V, b_V and norm placement (and a latent attention's down-projection and latent norm) give back
    the values the model computed."""
    from inseq_mixing.methods.blocks import branch_input

    model = get_tiny(family)
    kwargs = example_kwargs(family)
    trace = trace_of(model, kwargs)
    for stack_spec, stack in traced_stacks(trace):
        for layer, record in zip(stack_spec.layers, stack.layers, strict=True):
            weight, bias = layer.self_attn.value_weight()
            hidden = branch_input(layer.self_attn, record.input)
            latent = layer.self_attn.latent
            values = (hidden if latent is None else latent.norm(latent.down(hidden))) @ weight
            values = values + bias if bias is not None else values
            torch.testing.assert_close(values.view_as(record.self_attn.values), record.self_attn.values)
    if trace.encoder is not None:
        memory = trace.encoder.layers[-1].output
        if trace.spec.encoder.final_norm is not None:
            memory = trace.spec.encoder.final_norm(memory)
        for layer, record in zip(trace.spec.decoder.layers, trace.decoder.layers, strict=True):
            weight, bias = layer.cross_attn.value_weight()
            values = memory @ weight + (bias if bias is not None else 0)
            torch.testing.assert_close(values.view_as(record.cross_attn.values), record.cross_attn.values)


def test_spec_recomposes_logits_from_last_layer(family):
    """Final norm, LM-head scale, LM head and logit bias of the spec give the model's own logits."""
    model = get_tiny(family)
    trace = trace_of(model, example_kwargs(family))
    spec, stack = trace.spec, trace.decoder
    hidden = stack.layers[-1].output
    if spec.decoder.final_norm is not None:
        torch.testing.assert_close(stack.final_norm_input, hidden, rtol=0, atol=0)
        hidden = spec.decoder.final_norm(hidden)
    if spec.readout_proj is not None:
        hidden = spec.readout_proj(hidden)
    logits = spec.lm_head(hidden * spec.logits_scale)
    if spec.logits_bias is not None:
        logits = logits + spec.logits_bias
    torch.testing.assert_close(logits, trace.explained_logits, rtol=1e-5, atol=1e-5)
    if spec.logit_softcap is not None:  # Gemma 2: the model's own logits are the capped LM-head output
        cap = spec.logit_softcap
        torch.testing.assert_close(cap * torch.tanh(logits / cap), trace.logits, rtol=1e-5, atol=1e-5)
    else:
        assert trace.logits_before_softcap is None


def test_frozen_norms_reproduce_every_recorded_norm(family):
    """Each norm, frozen at its recorded input's statistics, is an affine map that gives the norm's output; its
    transpose and its dot product with a vector (parts of several components at each position) agree with it."""
    model = get_tiny(family)
    trace = trace_of(model, example_kwargs(family))
    for stack_spec, stack in traced_stacks(trace):
        pairs = [(stack_spec.final_norm, stack.final_norm_input)] if stack_spec.final_norm is not None else []
        for layer, record in zip(stack_spec.layers, stack.layers, strict=True):
            pairs.append((layer.ffn.norm, record.ffn_norm_input))
            pairs.append((layer.ffn.out_norm, record.ffn_out_norm_input))
            pairs.append((layer.self_attn.norm, record.self_attn.norm_input))
            pairs.append((layer.self_attn.out_norm, record.self_attn.output))
            if layer.cross_attn is not None:
                pairs.append((layer.cross_attn.norm, record.cross_attn.norm_input))
        pairs = [(norm, norm_input) for norm, norm_input in pairs if norm is not None]
        assert pairs or stack_spec.final_norm is None
        for norm, norm_input in pairs:
            frozen = freeze_norm(norm, norm_input)
            shift = 0 if frozen.shift is None else frozen.shift
            torch.testing.assert_close(frozen.linear(norm_input) + shift, norm(norm_input), rtol=0, atol=2e-6)
            other, direction = torch.randn_like(norm_input), torch.randn_like(norm_input)
            torch.testing.assert_close(
                (frozen.linear(other) * direction).sum(), (other * frozen.transpose(direction)).sum()
            )
            d_model = norm_input.shape[-1]
            parts, vector = torch.randn(*norm_input.shape[:2], 3, d_model), torch.randn(d_model)
            torch.testing.assert_close(frozen.dot_linear(parts, vector), frozen.linear(parts) @ vector)


def dense_ffn(ffn, hidden: torch.Tensor) -> torch.Tensor:
    """A dense FFN from the maps its spec names (a gated FFN's linear branch through its own map and offset)."""
    inner = ffn.w_in(hidden)
    inner = ffn.activation(ffn.w_gate(hidden)) * ffn.linear_branch(inner) if ffn.is_gated else ffn.activation(inner)
    return ffn.w_out(inner)


def mixture_of_named_experts(ffn: MoESpec, hidden: torch.Tensor, routing) -> torch.Tensor:
    """A mixture of experts from its spec's experts and the trace's recorded routing, one position at a time."""
    weights, experts = routing
    out = torch.zeros_like(hidden)
    for b, t in itertools.product(range(hidden.shape[0]), range(hidden.shape[1])):
        for weight, expert in zip(weights[b, t].tolist(), experts[b, t].tolist(), strict=True):
            out[b, t] += weight * dense_ffn(ffn.expert(expert), hidden[b, t])
    if ffn.shared is not None:
        gate = 1.0 if ffn.shared_gate is None else torch.sigmoid(ffn.shared_gate(hidden))
        out += gate * dense_ffn(ffn.shared, hidden)
    return out


def test_ffn_spec_recomposes_the_ffn(family):
    """The FFN's linear maps and activation, as the spec names them, give the model's own FFN output; a mixture of
    experts' named experts, weighted by the routing the trace recorded, give the block's own output."""
    model = get_tiny(family)
    trace = trace_of(model, example_kwargs(family, batch=2))
    for stack_spec, stack in traced_stacks(trace):
        for layer, record in zip(stack_spec.layers, stack.layers, strict=True):
            ffn = layer.ffn
            hidden = record.ffn_norm_input if ffn.in_norm is None else ffn.in_norm(record.ffn_norm_input)
            rtol = 0.0
            if isinstance(ffn, MoESpec):
                assert record.ffn_routing[1].shape == (*hidden.shape[:2], ffn.top_k)
                recomposed = mixture_of_named_experts(ffn, hidden, record.ffn_routing)
                rtol = 16 * torch.finfo(hidden.dtype).eps  # the experts' weighted sum taken in another order
            else:
                assert record.ffn_routing is None
                recomposed = dense_ffn(ffn, hidden)
            torch.testing.assert_close(recomposed, ffn.forward(hidden), rtol=rtol, atol=1e-6)


def test_cross_attention_reruns_read_the_encoders_keys_once(seq2seq_family):
    """Re-running a cross-attention on new queries reads the recorded call's keys and values from a filled cache
    (projected once), and gives what projecting the encoder states again gives."""
    model = get_tiny(seq2seq_family)
    trace = trace_of(model, example_kwargs(seq2seq_family, batch=2))
    spec, record = trace.spec.decoder.layers[-1], trace.decoder.layers[-1].cross_attn
    module = spec.cross_attn.module
    queries = torch.randn(3, record.output.shape[1], record.output.shape[-1], dtype=record.output.dtype)
    rows = torch.tensor([0, 1, 1]) % record.output.shape[0]
    record.cross_keys = None
    with torch.no_grad():
        cached = record.rerun(module, queries, rows, slice(None))
        keys, values = record.keys_and_values(module)
        record.cross_keys = False  # project the encoder states again
        projected = record.rerun(module, queries, rows, slice(None))
        record.cross_keys = (torch.zeros_like(keys), torch.zeros_like(values))  # the cache is what is read
        zeroed = record.rerun(module, queries, rows, slice(None))
    record.cross_keys = None
    torch.testing.assert_close(cached, projected)
    assert not torch.allclose(zeroed, projected)


def test_skipped_head_gives_the_models_own_explained_logits(family):
    """A trace without the LM head's full-vocabulary product gathers the model's own logits (and soft-capped logits)
    of any token from the final hidden state, never runs the head's product, and leaves the head as it was."""
    from inseq_mixing.methods.readout import recorded_logit, softcapped_logit

    model = get_tiny(family)
    kwargs = example_kwargs(family)
    spec = get_spec(model)
    products = []
    counter = spec.lm_head.register_forward_hook(lambda module, args, out: products.append(out.stride()))
    try:
        trace = trace_of(model, kwargs, full_logits=False)
    finally:
        counter.remove()
    assert trace.logits is None and "forward" not in vars(spec.lm_head)
    assert products and all(0 in strides for strides in products)  # the head returned a broadcast view, no product
    own = forward_logits(model, {**kwargs, "use_cache": False})
    ids = torch.randint(0, own.shape[-1], own.shape[:-1])
    foils = torch.randint(0, own.shape[-1], own.shape[:-1])
    expected = own.gather(-1, ids[..., None])[..., 0] - own.gather(-1, foils[..., None])[..., 0]
    mask = trace.decoder.mask
    if spec.logit_softcap is None:
        torch.testing.assert_close(recorded_logit(trace, ids, foils) * mask, expected * mask, rtol=1e-5, atol=1e-5)
        assert softcapped_logit(trace, ids, foils) is None
    else:
        torch.testing.assert_close(softcapped_logit(trace, ids, foils) * mask, expected * mask, rtol=1e-5, atol=1e-5)
        full = trace_of(model, kwargs)
        torch.testing.assert_close(recorded_logit(trace, ids, foils), recorded_logit(full, ids, foils))
    torch.testing.assert_close(forward_logits(model, {**kwargs, "use_cache": False}), own, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_skipped_head_still_refuses_non_finite_head_weights_changed_after_a_first_trace(family):
    """Without the full logits, a NaN in an unembedding row of a token nobody explains (or in the logit bias) is still
    refused: the head's weights are checked once, and again after any in-place change."""
    model = tiny_model(family)
    kwargs = example_kwargs(family)
    spec = get_spec(model)
    trace_of(model, kwargs, full_logits=False)  # finite: checked and remembered
    with torch.no_grad():
        if spec.logits_bias is not None:
            spec.logits_bias[..., -1] = float("inf")
        else:
            spec.lm_head.weight[-1, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        trace_of(model, kwargs, full_logits=False)
