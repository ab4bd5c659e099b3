r"""AttnLRP (Achtibat et al., ICML 2024): layer-wise relevance propagation with attention-aware rules.

Paper: Reduan Achtibat, Sayed Mohammad Vakilzadeh Hatefi, Maximilian Dreyer, Aakriti Jain, Thomas Wiegand, Sebastian
Lapuschkin, Wojciech Samek. "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers". ICML 2024.
https://proceedings.mlr.press/v235/achtibat24a.html

The explained logit :math:`z` is the relevance of the output; every operation passes relevance :math:`R` from its
output to its inputs by one rule:

* linear maps (projections, the LM head, rotary embeddings, a norm's mean subtraction): the ε-rule with
  :math:`\varepsilon \to 0`, :math:`R_i = \sum_j x_i W_{ji} R_j / z_j`; a bias keeps its own share;
* element-wise activations (GELU, SiLU, ...): the identity rule, :math:`R_x = R_y`;
* layer norms and RMSNorms: the identity rule on the division by :math:`\sigma` (or the rms), so the norm is the
  linear map of its frozen statistics (:mod:`.norms`) and its shift keeps its share;
* the bilinear products :math:`q k^\top`, :math:`A V` and a gated FFN's :math:`\mathrm{act}(g) \odot u`: the
  uniform rule, each factor gets half of the product's relevance;
* softmax :math:`s = \mathrm{softmax}(x)`: :math:`R_{x_i} = x_i (R_{s_i} - s_i \sum_j R_{s_j})`.

Every rule reads :math:`R = x \odot \tilde g` for a modified gradient :math:`\tilde g`, so one backward pass of the
real model with modified gradients gives all relevances. The modifications sit at module boundaries: the identity rule
replaces the gradient of every norm and activation module; the gradient entering an attention module's inputs
(queries, and keys and values for cross-attention) is scaled by ¼ and that of its value-projection outputs by 2
(values get ½ from :math:`A V`, queries and keys ¼ from :math:`A V` then :math:`q k^\top`; the softmax rule is the
softmax's own gradient times its input); a gated FFN's input gradient is halved. A token's relevance for the logit
at position :math:`t` is :math:`R_j = h^0_j \cdot \tilde g_j` at the input of the first block (token embedding with
its position embedding, as the other methods attribute :math:`h^0`).

Conservation: token relevances add up to :math:`z` minus an absorbed part: the shares of biases, norm shifts and
position biases, and the softmax rule's term :math:`-\sum_i x_i s_i \sum_j R_{s_j}` per attention row; it is
returned per position.

Checked against the authors' library ``lxt`` 2.1 (its rules on the same models: GPT-2, Llama, Qwen2, Qwen3, Gemma 3).

Our choices, flagged: ε = 0 (``lxt`` adds 1e-10 to its identity rule's denominator); relevance read at :math:`h^0`
rather than at the token embedding, and at every vector the stack adds to a position between its blocks (Qwen3-VL's
DeepStack features), credited to that position as its embedding's is; Gemma 2's attention-logit soft-cap, which sits
inside the attention kernel, passes relevance with its own gradient (≈ 1 for scores well below the cap) instead of the
identity rule; encoder–decoders (our extension; the paper covers decoder-only and encoder-only models) propagate
through cross-attention with the same rules, source relevance read at the encoder's first block; encoder-only models
(the paper treats them) start from the final hidden state along the direction of their head frozen at the forward pass
(:mod:`.head`: the identity rule on the head's activations and norms is that frozen map), the head's biases and norm
shifts absorbed. A span of generated tokens may be explained as one quantity, its summed logit, in one backward pass
(:func:`span_lrp_of_call`; our extension, after FlashTrace): the rules are linear in the relevance they pass down, so
it equals the sum of the tokens' own relevances. A mixture of experts (our extension): its routing weights and a shared
expert's sigmoid gate are constants of the pass (their outputs detached), each expert a gated FFN under the rules
above. Token mixers that are not attention (hybrids; our extension) run under MambaLRP's rules (:data:`MIXER_RULES`);
Qwen3-Next's gated attention under the rules above, its output gate as a gated FFN's (``σ`` under the identity rule,
the uniform rule on the product).
"""

import functools
import inspect
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..specs import FFNSpec, ModelSpec
from ..specs.base import InjectedInputs, MixerSpec, MoESpec, SharedAttention, UnsupportedModelError, is_norm
from ..trace import (
    ModelCall,
    ModelTrace,
    decoder_mask,
    eval_mode,
    forward_arguments,
    head_skipped,
    refuse_non_finite_forward,
    replaced_forward,
    trace_model,
)
from .blocks import refuse_non_finite
from .chunking import DEFAULT_CHUNK_ELEMENTS, items_per_chunk
from .mixers import (
    FrozenMixer,
    attention_inputs,
    attention_probs,
    causal_taps,
    deltanet_projections,
    inverse_rms,
    mamba2_projected,
    mix_heads,
    padding_mask,
    scan_values_and_gate,
)
from .norms import freeze_norm
from .readout import NO_HEAD, head_input_logit, readout

#: Bound on the activations of one chunk of explained positions (copies × layers × tokens × (tokens · heads + 8 ·
#: d_model) elements).
#: Names under which attention modules receive the states their keys and values are computed from (cross-attention).
KEY_VALUE_ARGUMENTS = ("key_value_states", "encoder_hidden_states")


@dataclass
class AttnLrpScores:
    """AttnLRP relevances for the token predicted at every explained position.

    Attributes:
        target: ``(B, T, T)``: relevance of target-prefix token ``j`` (decoder-only: any token) for the logit at
            position ``t``; 0 for ``j > t``, padding and positions not explained.
        source: ``(B, T, S)``: relevance of source token ``s`` (encoder–decoders).
        logit: The explained logit (minus the foil's), ``(B, T)``, before a final soft-cap.
        absorbed: ``logit`` minus all token relevances, ``(B, T)`` (biases, norm shifts, the softmax rule's term).
        logit_after_softcap: For models with a final soft-cap, the model's final logit (minus the foil's).
    """

    target: torch.Tensor
    source: torch.Tensor | None
    logit: torch.Tensor
    absorbed: torch.Tensor
    logit_after_softcap: torch.Tensor | None = None


def with_gradient_scaled(tensor: torch.Tensor, factor: float | torch.Tensor) -> torch.Tensor:
    """``tensor`` unchanged, its gradient multiplied by ``factor`` (a number, or one per last-axis entry)."""
    frozen = tensor.detach()
    return frozen + factor * (tensor - frozen)


def identity_rule(output: torch.Tensor, tensor_input: torch.Tensor) -> torch.Tensor:
    """An element-wise map's ``output`` unchanged, its gradient ``y / x`` (so that :math:`x \\tilde g_x = y \\tilde
    g_y`: the identity rule); 0 where ``x = 0``."""
    ratio = torch.where(tensor_input == 0, torch.zeros_like(output), output / tensor_input).detach()
    return output.detach() + ratio * (tensor_input - tensor_input.detach())


def frozen_norm_rule(norm: nn.Module, output: torch.Tensor, tensor_input: torch.Tensor) -> torch.Tensor:
    """A norm's ``output`` unchanged, its gradient that of the norm with its statistics frozen (the identity rule on
    the division by σ)."""
    flat = tensor_input.reshape(1, -1, tensor_input.shape[-1])
    linear = freeze_norm(norm, flat.detach()).linear(flat).reshape(output.shape)
    return output.detach() + (linear - linear.detach()).to(output.dtype)


def _scale_attention_inputs(_module, args, kwargs):
    """Queries (and cross-attention's key/value states) pass ¼ of the gradient."""
    if args:
        args = (with_gradient_scaled(args[0], 0.25), *args[1:])
    else:
        kwargs["hidden_states"] = with_gradient_scaled(kwargs["hidden_states"], 0.25)
    for name in KEY_VALUE_ARGUMENTS:
        if isinstance(kwargs.get(name), torch.Tensor):
            kwargs[name] = with_gradient_scaled(kwargs[name], 0.25)
    return args, kwargs


def _value_factor(value_slice, width: int, like: torch.Tensor) -> torch.Tensor:
    """1 on every output of a (fused) projection, 2 on its value outputs."""
    factor = torch.ones(width, dtype=like.dtype, device=like.device)
    index = value_slice.to(like.device) if isinstance(value_slice, torch.Tensor) else value_slice
    factor[index] = 2.0
    return factor


def _halved_first_input(_module, args):
    return (with_gradient_scaled(args[0], 0.5), *args[1:])


def _detached_output(_module, _args, output):
    return tuple(part.detach() for part in output) if isinstance(output, tuple) else output.detach()


def _tapped(values: torch.Tensor, conv: nn.Conv1d, channels: slice = slice(None)) -> torch.Tensor:
    """A causal depthwise convolution (``channels`` of ``conv``) of ``(B, T, C)``: linear, so its ε-rule is its
    gradient."""
    return causal_taps(values, conv.weight[channels].squeeze(1), None if conv.bias is None else conv.bias[channels])


def _mamba2_rules(module: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **_):
    """A Mamba-2 layer under MambaLRP's rules: the steps, decays and state projections ``B``, ``C`` constants of the
    pass (the SSD matrix detached), ``silu`` on the values and the gate under the identity rule, the gate's product
    with the SSD output under the uniform rule, the gated norm's statistics frozen; the projections and the
    convolution linear."""
    hidden = hidden_states
    frozen = FrozenMixer.mamba2(module, hidden.detach(), attention_mask)
    inner, readout = module.intermediate_size, frozen.readout
    projected = mamba2_projected(module, hidden * padding_mask(hidden, attention_mask)[..., None])
    gate, values = projected[..., :inner].float(), projected[..., inner : 2 * inner]
    activated = _tapped(values, module.conv1d, slice(0, inner)).float() * frozen.ratio.detach()  # σ(u) frozen
    y = mix_heads(frozen.mixing.detach(), activated, frozen.heads)
    if readout.norm is not None and not readout.gate_first:  # normed before the gate (Falcon-H1's option)
        weight, eps, group = readout.norm
        y = y * (inverse_rms(readout.y, eps, group) * weight).detach()  # the norm's statistics frozen
    gated = with_gradient_scaled(y, 0.5) * with_gradient_scaled(identity_rule(F.silu(gate), gate), 0.5)
    if readout.norm is not None and readout.gate_first:
        weight, eps, group = readout.norm
        gated = gated * (inverse_rms(readout.y * readout.gate, eps, group) * weight).detach()
    return module.out_proj(gated.to(hidden.dtype))


def _scan_rules(freeze, interleaved: bool, module: nn.Module, hidden_states: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """A selective scan (Mamba's, or Zamba's in heads: ``freeze`` is its :class:`.mixers.FrozenMixer` constructor,
    ``interleaved`` its projection's layout, :func:`.mixers.scan_values_and_gate`) under MambaLRP's rules: its steps
    and state projections constants of the pass (the per-channel mixing detached), ``silu`` on the values and the gate
    under the identity rule, the gate's product with the scan's output under the uniform rule; the projections and
    the convolution linear."""
    hidden = hidden_states
    frozen = freeze(module, hidden.detach(), attention_mask)
    projected = module.in_proj(hidden * padding_mask(hidden, attention_mask)[..., None])
    values, gate = scan_values_and_gate(projected, interleaved)
    activated = _tapped(values, module.conv1d).float() * frozen.ratio.detach()  # σ(u) frozen
    y = mix_heads(frozen.mixing.detach(), activated, frozen.heads)
    gate = gate.float()
    gated = with_gradient_scaled(y, 0.5) * with_gradient_scaled(identity_rule(F.silu(gate), gate), 0.5)
    return module.out_proj(gated.to(hidden.dtype))


def _mamba_rules(module: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **_):
    """A Mamba (selective scan) layer under MambaLRP's rules (:func:`_scan_rules`)."""
    return _scan_rules(FrozenMixer.mamba, False, module, hidden_states, attention_mask)


def _mamba_heads_rules(module: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       **_) -> torch.Tensor:  # fmt: skip
    """Zamba's Mamba layer (a selective scan in heads, :meth:`.mixers.FrozenMixer.mamba_heads`) under MambaLRP's
    rules (:func:`_scan_rules`)."""
    return _scan_rules(FrozenMixer.mamba_heads, True, module, hidden_states, attention_mask)


def _lfm2_rules(module: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **_):
    """An LFM2 short convolution ``out_proj(C ⊙ conv(B ⊙ x))``: both gates' products under the uniform rule, the
    projections and the convolution linear."""
    masked = hidden_states * padding_mask(hidden_states, attention_mask)[..., None]
    gate_in, gate_out, values = module.in_proj(masked).chunk(3, dim=-1)
    gated = with_gradient_scaled(gate_in, 0.5) * with_gradient_scaled(values, 0.5)
    tapped = _tapped(gated, module.conv)
    return module.out_proj(with_gradient_scaled(gate_out, 0.5) * with_gradient_scaled(tapped, 0.5))


def _gated_deltanet_rules(module: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                          **_) -> torch.Tensor:  # fmt: skip
    """A Gated DeltaNet layer under the rules Mamba-2's take: its queries, keys, steps ``β`` and decays ``α`` constants
    of the pass (the delta rule's mixing detached), ``silu`` on the values and the gate under the identity rule, the
    gated norm's statistics frozen, the gate's product with the normed output under the uniform rule; the
    projections and the convolution linear (our extension: no paper gives it rules)."""
    hidden = hidden_states
    frozen = FrozenMixer.gated_deltanet(module, hidden.detach(), attention_mask)
    projected = deltanet_projections(module, hidden * padding_mask(hidden, attention_mask)[..., None])
    values, gate = projected[2].flatten(2), projected[3].flatten(2).float()
    keys = 2 * module.key_dim
    activated = _tapped(values, module.conv1d, slice(keys, None)).float() * frozen.ratio.detach()  # σ(u) frozen
    y = mix_heads(frozen.mixing.detach(), activated, frozen.heads)
    weight, eps, group = frozen.readout.norm
    normed = y * (inverse_rms(frozen.readout.y, eps, group) * weight).detach()  # the norm's statistics frozen
    gated = with_gradient_scaled(normed, 0.5) * with_gradient_scaled(identity_rule(F.silu(gate), gate), 0.5)
    return module.out_proj(gated.to(hidden.dtype))


def _gated_attention_rules(module: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                           position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, **_):  # fmt: skip
    """Gated softmax attention (Qwen3-Next's) under AttnLRP's own rules: the uniform rule on ``q kᵀ`` and on
    ``A V``, the softmax's rule (its own gradient), the q/k norms frozen; the output gate ``σ(g)`` under the identity
    rule and its product with the attention output under the uniform rule, as a gated FFN's (our extension: the
    paper has no output gate). Returns the module's ``(output, None)``."""
    query, key, value, gate = attention_inputs(module, hidden_states, position_embeddings, gated=True)
    probs, _ = attention_probs(module, with_gradient_scaled(query, 0.5), with_gradient_scaled(key, 0.5),
                               attention_mask)  # fmt: skip
    values = value.float().repeat_interleave(module.num_key_value_groups, dim=2).flatten(2)
    mixed = mix_heads(with_gradient_scaled(probs, 0.5), with_gradient_scaled(values, 0.5), probs.shape[1])
    gate = gate.float()
    gated = with_gradient_scaled(mixed, 0.5) * with_gradient_scaled(identity_rule(torch.sigmoid(gate), gate), 0.5)
    return module.o_proj(gated.to(hidden_states.dtype)), None


def _ffn_rules(ffn: FFNSpec, hidden: torch.Tensor, *_args, **_kwargs) -> torch.Tensor:
    """An FFN whose activation is a function, not a module (LFM2's ``w2(silu(w1 x) ⊙ w3 x)``), run from its spec
    under the rules: the activation under the identity rule, a gated FFN's product under the uniform rule."""
    pre = (ffn.w_gate or ffn.w_in)(hidden)
    activated = identity_rule(ffn.activation(pre), pre)
    if ffn.is_gated:
        activated = with_gradient_scaled(activated, 0.5) * with_gradient_scaled(ffn.w_in(hidden), 0.5)
    return ffn.w_out(activated)


#: How each kind of token mixer that is not attention runs in an AttnLRP pass (its forward replaced by one with the
#: same output and the rules' gradients): MambaLRP's rules (Jafari et al., NeurIPS 2024: the selective state
#: space's parameters constants of the pass, ``silu``'s gate detached, the uniform rule on multiplicative gates, the
#: norms' statistics frozen), which AttnLRP's own rules for activations, norms and products match; our extension to
#: hybrids and to LFM2's convolutions. A kind not here is refused.
MIXER_RULES = {"mamba": _mamba_rules, "mamba_heads": _mamba_heads_rules, "mamba2": _mamba2_rules, "lfm2": _lfm2_rules,
               "gated_deltanet": _gated_deltanet_rules, "gated_attention": _gated_attention_rules,
               "none": lambda module, hidden_states, *_args, **_kwargs: module(hidden_states)}  # fmt: skip


def _experts_function_swapped(ffn: FFNSpec | MoESpec, hooks: ExitStack) -> tuple:
    """The FFN's activations AttnLRP hooks. A mixture whose experts call an activation function of their own
    (LFM2-MoE's ``F.silu``, an attribute of the experts, not a module) gets, for the pass, that function under the
    identity rule in its place (restored on exit): the rest of its activations are returned."""
    experts = getattr(ffn, "experts", None)
    own = vars(experts).get("act_fn") if experts is not None else None
    if own is None or isinstance(own, nn.Module) or ffn.activation is not None:
        return ffn.activations
    rest = tuple(activation for activation in ffn.activations if activation is not own)
    experts.act_fn = lambda gate: identity_rule(own(gate), gate)
    hooks.callback(setattr, experts, "act_fn", own)
    return rest


def _ffns(layer) -> tuple:
    """A block's FFN, and the FFN of a shared attention block its mixer reads
    (:class:`~..specs.base.SharedAttention`)."""
    shared = layer.self_attn.module if isinstance(layer.self_attn, MixerSpec) else None
    return (layer.ffn, shared.ffn) if isinstance(shared, SharedAttention) else (layer.ffn,)


def _branches(attn) -> tuple:
    """A token-mixing sub-block's specs: a mixer's (:attr:`~..specs.base.MixerSpec.branch_specs`), or the
    attention's own."""
    return attn.branch_specs if isinstance(attn, MixerSpec) else (attn,)


def _mixers_under_rules(attn) -> list[tuple[nn.Module, str]]:
    """The modules of a sub-block whose forward AttnLRP replaces, with their kinds: its mixers that are not plain
    attention."""
    return [(spec.module, spec.kind) for spec in _branches(attn) if isinstance(spec, MixerSpec)
            and spec.kind != "attention"]  # fmt: skip


def _attention_under_rules(attn) -> list[tuple[nn.Module | None, nn.Module, slice]]:
    """A sub-block's softmax attention that runs under AttnLRP's own hooks (an attention sub-block, plain attention
    as a parallel mixer's branch, a shared attention block's): its module, value projection and the values' slice of
    it; a value adapter's entry has no module (only its output is hooked)."""
    found = []
    if isinstance(attn, MixerSpec) and isinstance(attn.module, SharedAttention):
        shared = attn.module
        projection, adapter = shared.value.wrapped
        found.append((shared.attention, projection, slice(None)))
        if adapter is not None:
            found.append((None, adapter, slice(None)))
    for spec in _branches(attn):
        if not isinstance(spec, MixerSpec):
            found.append((spec.module, spec.value_proj, spec.value_slice))
        elif spec.kind == "attention":
            found.append((spec.module, spec.module.v_proj, slice(None)))
    return found


def _ffn_under_rules(ffn: FFNSpec | MoESpec, spec: ModelSpec, hooks: ExitStack) -> None:
    """An FFN's rules, their hooks removed when ``hooks`` closes: its activations under the identity rule, a gated
    FFN's product under the uniform rule (its input's gradient halved), a mixture's routing constants of the pass; an
    FFN whose activation is a function runs from its spec under the rules (:func:`_ffn_rules`).

    Raises:
        UnsupportedModelError: Its activation is a function and it cannot run from its spec.
    """

    def add(handle):
        hooks.callback(handle.remove)

    activations = _experts_function_swapped(ffn, hooks)
    modules = (*activations, *ffn.product_inputs)
    if not all(isinstance(module, nn.Module) for module in modules):
        if not isinstance(ffn, FFNSpec) or ffn.linear_activation is not None or not isinstance(
                ffn.forward, nn.Module):  # fmt: skip
            raise UnsupportedModelError(
                f"AttnLRP hooks the FFN's activation (and a gated FFN's module); {spec.family}'s are functions."
            )
        hooks.enter_context(replaced_forward(ffn.forward, functools.partial(_ffn_rules, ffn)))
        modules = ()
    for activation in activations if modules else ():
        add(activation.register_forward_hook(lambda _m, args, out: identity_rule(out, args[0])))
    for product in ffn.product_inputs if modules else ():  # both factors read this input: each gets half
        add(product.register_forward_pre_hook(_halved_first_input))
    for constant in ffn.constants:  # a mixture's routing weights and gates: constants of the pass
        add(constant.register_forward_hook(_detached_output))
    for experts, gate in ffn.own_gates:  # the experts' own gate, written with the modules hooked above
        experts._apply_gate = gate
        hooks.callback(vars(experts).pop, "_apply_gate", None)


@contextmanager
def lrp_rules(model: nn.Module, spec: ModelSpec) -> Iterator[None]:
    """Install the AttnLRP gradient modifications on the model's modules; removed on exit, whatever happens."""
    with ExitStack() as hooks:

        def add(handle):
            hooks.callback(handle.remove)

        for module in model.modules():
            if is_norm(module):
                add(module.register_forward_hook(lambda m, args, out: frozen_norm_rule(m, out, args[0])))
        for layer in (layer for stack in spec.stacks.values() for layer in stack.layers):
            for ffn in _ffns(layer):
                _ffn_under_rules(ffn, spec, hooks)
            for attn in (layer.self_attn, layer.cross_attn):
                if attn is None:
                    continue
                for module, kind in _mixers_under_rules(attn):  # each its forward under the rules (MIXER_RULES)
                    if kind not in MIXER_RULES:
                        raise UnsupportedModelError(f"AttnLRP has no rules for {kind} layers yet.")
                    hooks.enter_context(replaced_forward(module, functools.partial(MIXER_RULES[kind], module)))
                for module, value_proj, value_slice in _attention_under_rules(attn):
                    if module is not None:
                        add(module.register_forward_pre_hook(_scale_attention_inputs, with_kwargs=True))

                    def value_hook(_m, _args, out, value_slice=value_slice):
                        return with_gradient_scaled(out, _value_factor(value_slice, out.shape[-1], out))

                    add(value_proj.register_forward_hook(value_hook))
        yield


@contextmanager
def recomputed_blocks(spec: ModelSpec) -> Iterator[None]:
    """Every block runs under activation checkpointing: its forward keeps only its inputs for the backward pass, which
    runs the block again (its rules' hooks included) when the relevance reaches it. The backward pass then holds one
    block's activations at a time instead of every block's (at 1,000 tokens on a GPT-2-small-sized model, each block's
    attention keeps three 1000 × 1000 × 12 tensors: 1.7 GB for twelve), for one more forward pass of time. The
    recomputed block is the same computation on the same inputs, so the relevance does not change."""
    with ExitStack() as swaps:
        for block in spec.block_modules():

            def forward(*args, own=block.forward, **kwargs):
                return checkpoint(own, *args, use_reentrant=False, **kwargs)

            swaps.enter_context(replaced_forward(block, forward))
        yield


@contextmanager
def no_graph_before_blocks(model: nn.Module, spec: ModelSpec) -> Iterator[None]:
    """No autograd graph for what runs before a stack's first block (embeddings, a vision-language model's vision
    tower and projector): the relevance stops at the first block's input, a leaf (:func:`first_block_inputs`), so
    that graph would only hold memory (a Qwen2-VL-2B-shaped tower on four images: gigabytes of activations). The
    model's forward starts with gradients off; each first block turns them back on."""

    def switch(enabled: bool):
        def hook(*_) -> None:  # a pre-hook that returns something would replace the module's arguments
            torch.set_grad_enabled(enabled)

        return hook

    with ExitStack() as hooks:
        hooks.callback(model.register_forward_pre_hook(switch(False)).remove)
        for stack in spec.stacks.values():
            hooks.callback(stack.layers[0].module.register_forward_pre_hook(switch(True)).remove)
        yield


@contextmanager
def first_block_inputs(spec: ModelSpec, store: dict[str, torch.Tensor]) -> Iterator[None]:
    """Make the input of each stack's first block a leaf of the graph (``store["decoder"]``, ``store["encoder"]``),
    and each vector a stack adds between its blocks (:class:`~.specs.base.InjectedInputs`): ``store["decoder
    injected"]``, the leaves and the positions they are added at."""
    with ExitStack() as hooks:
        for name, stack in spec.stacks.items():
            if stack.injected is not None:
                hooks.callback(stack.injected.module.register_forward_pre_hook(
                    _injected_leaves(stack.injected, store, f"{name} injected"), with_kwargs=True).remove)  # fmt: skip

            def hook(_module, args, kwargs, name=name):
                states = (args[0] if args else kwargs["hidden_states"]).detach().requires_grad_(True)
                store[name] = states
                if args:
                    return (states, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": states}

            hooks.callback(stack.layers[0].module.register_forward_pre_hook(hook, with_kwargs=True).remove)
            for layer in stack.layers:  # a block that reads the embeddings besides its input: the same leaf
                if getattr(layer.self_attn, "reads_embeddings", False):
                    leaf = _embeddings_leaf(layer.module, layer.self_attn.module.embeddings, store, name,
                                            layer is stack.layers[0])  # fmt: skip
                    hooks.callback(layer.module.register_forward_pre_hook(leaf, with_kwargs=True).remove)
        yield


def _embeddings_leaf(block: nn.Module, argument: str, store: dict, name: str, first: bool):
    """A pre-hook on ``block`` that passes it the stack's input leaf (``store[name]``) as its argument ``argument``
    (the token embeddings it reads, Zamba 2's ``original_hidden_states``), so that their relevance reaches the tokens
    as the first block's input's does; at the first block, the argument is checked to be that input.

    Raises:
        TypeError: At the first block, the argument is not the block's input.
    """
    position = list(inspect.signature(block.forward).parameters).index(argument)

    def hook(_module, args, kwargs):
        leaf = store[name]
        given = args[position] if len(args) > position else kwargs[argument]
        if first and not torch.equal(given, leaf.detach()):
            raise TypeError(f"AttnLRP reads the block's {argument} as the stack's input, and they differ.")
        if len(args) > position:
            return (*args[:position], leaf, *args[position + 1 :]), kwargs
        return args, {**kwargs, argument: leaf}

    return hook


def _injected_leaves(injected: InjectedInputs, store: dict, key: str):
    """A pre-hook on ``injected.module`` that passes its added vectors on as leaves of the graph, kept in
    ``store[key]`` with their positions' mask (none added: nothing kept)."""

    def hook(_module, args, kwargs):
        vectors, mask = kwargs.get(injected.vectors), kwargs.get(injected.mask)
        store.pop(key, None)
        if vectors is None or mask is None:
            return None
        leaves = [vector.detach().requires_grad_(True) for vector in vectors]
        store[key] = (leaves, mask)
        return args, {**kwargs, injected.vectors: leaves}

    return hook


def _chunk_size(spec: ModelSpec, tokens: int, max_chunk_elements: int) -> int:
    layers = sum(len(stack.layers) for stack in spec.stacks.values())
    heads = max(layer.self_attn.num_heads for stack in spec.stacks.values() for layer in stack.layers)
    first = spec.decoder.layers[0].self_attn
    width = first.module.out_proj.out_features if isinstance(first, MixerSpec) else first.out_weight.shape[-1]
    per_copy = layers * tokens * (tokens * heads + 8 * width)
    return items_per_chunk(per_copy, max_chunk_elements)


def attn_lrp(
    model: nn.Module,
    spec: ModelSpec,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    target_ids: torch.Tensor | None,
    target_mask: torch.Tensor | None,
    explained_ids: torch.Tensor,
    foil_ids: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> AttnLrpScores:
    """AttnLRP relevances of the input tokens for the logit of ``explained_ids`` at every explained position.

    One forward and one backward pass per chunk of explained positions: each position is explained in its own copy
    of its sentence, the copies of a chunk batched together.

    Args:
        model: A supported Hugging Face model with an LM head.
        spec: Its spec.
        input_ids: Source ids ``(B, S)`` (encoder–decoders) or the whole sequence ``(B, T)`` (decoder-only).
        attention_mask: Mask of ``input_ids``.
        target_ids: Decoder prefix ``(B, T)`` of encoder–decoders, else None.
        target_mask: Its mask.
        explained_ids: ``(B, T)``: the token whose logit is explained at each decoder position.
        foil_ids: ``(B, T)``: contrast tokens; explains ``logit(target) - logit(foil)``.
        positions: ``(B, T)`` booleans: the decoder positions to explain (default: every real position).
        max_chunk_elements: Memory bound of one chunk of copies (see :data:`DEFAULT_CHUNK_ELEMENTS`).

    Returns:
        :class:`AttnLrpScores`.
    """
    if not spec.explains_logits:
        raise ValueError(NO_HEAD.format(method="AttnLRP"))
    if spec.head is not None:  # the frozen head's direction is read from a trace
        trace = trace_model(model, input_ids, attention_mask, target_ids, target_mask, spec=spec)
        return attn_lrp_of_trace(trace, explained_ids, foil_ids, positions, max_chunk_elements)
    call = ModelCall(model, forward_arguments(model, spec, input_ids, attention_mask, target_ids, target_mask))
    return lrp_of_call(spec, call, explained_ids, foil_ids, positions, max_chunk_elements)


def attn_lrp_of_trace(
    trace: ModelTrace,
    explained_ids: torch.Tensor,
    foil_ids: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> AttnLrpScores:
    """:func:`attn_lrp` of a traced forward pass: its passes run the traced call (the same model and arguments).
    Encoder-only models start from the final hidden state along their frozen head's direction (:mod:`.head`): the
    identity rule on the head's activations and norms is that frozen map."""
    if not trace.spec.explains_logits:
        raise ValueError(NO_HEAD.format(method="AttnLRP"))
    head = None if trace.spec.head is None else readout(trace, explained_ids, foil_ids)
    return lrp_of_call(trace.spec, trace.call, explained_ids, foil_ids, positions, max_chunk_elements, head)


def lrp_of_call(
    spec: ModelSpec,
    call: ModelCall,
    explained_ids: torch.Tensor,
    foil_ids: torch.Tensor | None,
    positions: torch.Tensor | None,
    max_chunk_elements: int,
    head: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> AttnLrpScores:
    """The relevance passes of :func:`attn_lrp` on one prepared call; ``head``: an encoder head's frozen direction
    ``(B, T, D)`` and constant ``(B, T)``, where the relevance starts instead of the logits."""
    model = call.model
    mask = call.decoder_mask.bool()
    positions = mask if positions is None else positions & mask
    rows, columns = positions.nonzero(as_tuple=True)
    batch, length = mask.shape
    dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    target = torch.zeros(batch, length, length, dtype=dtype, device=mask.device)
    sources = call.encoder_mask.shape[1] if spec.is_encoder_decoder else 0
    source = None if not spec.is_encoder_decoder else target.new_zeros(batch, length, sources)
    logit = target.new_zeros(batch, length)
    capped = None if spec.logit_softcap is None else target.new_zeros(batch, length)
    chunk = _chunk_size(spec, length + sources, max_chunk_elements)
    pooled = spec.head is not None and bool(spec.head.pooling)  # one copy per logit, its direction on every state
    with lrp_pass(model, spec) as recorded:
        for start in range(0, len(rows), chunk):
            copies, at = rows[start : start + chunk], columns[start : start + chunk]
            pair = (copies, at)
            copy_kwargs = call.rows(copies)
            foils = None if foil_ids is None else foil_ids[pair]
            copy_head = None if head is None else (head[0][copies if pooled else pair], head[1][pair])
            relevance, explained, final = _relevance(
                model, recorded, copy_kwargs, at, explained_ids[pair], foils, copy_head
            )
            target[pair] = relevance["decoder"].to(dtype)
            logit[pair] = explained.to(dtype)
            if capped is not None:
                capped[pair] = final.to(dtype)
            if source is not None:
                source[pair] = relevance["encoder"].to(dtype)
    refuse_non_finite("AttnLRP", target, source)
    attributed = target.sum(-1) + (0 if source is None else source.sum(-1))
    return AttnLrpScores(
        target=target,
        source=source,
        logit=logit * positions,
        absorbed=(logit - attributed) * positions,
        logit_after_softcap=None if capped is None else capped * positions,
    )


@dataclass
class AttnLrpSpanScores:
    """AttnLRP relevances for a span: the sum of the logits explained at each sentence's positions, as one quantity.

    Attributes:
        target: ``(B, T)``: relevance of each target-prefix token (decoder-only: any token) for the span's logit.
        source: ``(B, S)``: relevance of each source token (encoder–decoders), else None.
        logit: ``(B,)``: the span's logit, the sum of its positions' logits (minus their foils'), before a soft-cap.
        absorbed: ``(B,)``: ``logit`` minus all token relevances.
    """

    target: torch.Tensor
    source: torch.Tensor | None
    logit: torch.Tensor
    absorbed: torch.Tensor


def span_lrp_of_call(
    spec: ModelSpec,
    call: ModelCall,
    explained_ids: torch.Tensor,
    foil_ids: torch.Tensor | None,
    positions: torch.Tensor,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> AttnLrpSpanScores:
    r"""AttnLRP of a span in one forward and one backward pass per sentence (**our extension**, after FlashTrace's
    one pass per target span): the relevance starts at :math:`\sum_{t \in \text{span}} z_t`, the sum of the logits
    explained at the sentence's ``positions`` ``(B, T)``, instead of at each :math:`z_t` in a copy of its own. Every
    rule passes relevance linearly (the real backward pass, its gradients scaled by factors of the forward pass alone),
    so the result is the sum of the positions' own relevances, for the cost of one position. The LM head's
    full-vocabulary product is skipped: the explained logits are the unembedding rows of their tokens times what the
    head was given (:func:`.readout.head_input_logit`), the same linear map with the same gradient. Generation models
    only (an encoder's head explains one entry per row already)."""
    if spec.head is not None:
        raise ValueError("A span is a run of generated tokens: explain an encoder's entries one by one.")
    model = call.model
    mask = call.decoder_mask.bool()
    positions = positions.bool() & mask
    batch, length = mask.shape
    dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    target = torch.zeros(batch, length, dtype=dtype, device=mask.device)
    sources = call.encoder_mask.shape[1] if spec.is_encoder_decoder else 0
    source = target.new_zeros(batch, sources) if spec.is_encoder_decoder else None
    logit = target.new_zeros(batch)
    rows = positions.any(1).nonzero().flatten()
    chunk = _chunk_size(spec, length + sources, max_chunk_elements)
    with lrp_pass(model, spec) as recorded:
        for start in range(0, len(rows), chunk):
            copies = rows[start : start + chunk]
            copy_kwargs = call.rows(copies)
            head = {}
            with head_skipped(spec.lm_head, head):  # the explained logits alone, before a final soft-cap
                model(**copy_kwargs)
            foils = None if foil_ids is None else foil_ids[copies]
            chosen = head_input_logit(spec, head["input"], explained_ids[copies], foils)
            if spec.scale_after_head:  # the model scales the head's output, not its input
                chosen = chosen * spec.logits_scale
            refuse_non_finite_forward(model, chosen.detach()[..., None], decoder_mask(copy_kwargs))
            objective = (chosen * positions[copies]).sum(-1)
            relevance = input_relevance(recorded, objective)
            target[copies] = relevance["decoder"].to(dtype)
            if source is not None:
                source[copies] = relevance["encoder"].to(dtype)
            logit[copies] = objective.detach().to(dtype)
    refuse_non_finite("AttnLRP", target, source)
    attributed = target.sum(-1) + (0 if source is None else source.sum(-1))
    return AttnLrpSpanScores(target=target, source=source, logit=logit, absorbed=logit - attributed)


@contextmanager
def lrp_pass(model: nn.Module, spec: ModelSpec) -> Iterator[dict[str, torch.Tensor]]:
    """Eval mode, gradients on, the AttnLRP rules installed; yields what each forward pass records: the first-block
    inputs (``"decoder"``, ``"encoder"``) and, for models with a final soft-cap, the LM head's ``"logits"``. Hooks
    are removed and the model's flags restored on exit, whatever happens."""
    recorded: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        stack.enter_context(eval_mode(model))
        stack.enter_context(torch.enable_grad())  # restored on exit, whatever a hook below set it to
        stack.enter_context(no_graph_before_blocks(model, spec))
        stack.enter_context(lrp_rules(model, spec))
        stack.enter_context(first_block_inputs(spec, recorded))
        stack.enter_context(recomputed_blocks(spec))
        if spec.logit_softcap is not None:  # explain the logit before the cap
            handle = spec.lm_head.register_forward_hook(lambda _m, _a, out: recorded.update(logits=out))
            stack.callback(handle.remove)
        if spec.is_encoder_only:  # what an encoder's head reads
            last = spec.decoder.final_norm or spec.decoder.layers[-1].module
            handle = last.register_forward_hook(
                lambda _m, _a, out: recorded.update(final=out[0] if isinstance(out, tuple) else out)
            )
            stack.callback(handle.remove)
        yield recorded


def _relevance(
    model: nn.Module,
    recorded: dict[str, torch.Tensor],
    kwargs: dict,
    at: torch.Tensor,
    ids: torch.Tensor,
    foils: torch.Tensor | None,
    head: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """One forward and backward pass of a chunk of copies inside :func:`lrp_pass`, copy ``c`` explaining position
    ``at[c]``: relevance of every token of each stack ``(copies, tokens)``, the explained logit (minus the foil's) and
    the model's final one (after a soft-cap), each ``(copies,)``. ``head``: each copy's frozen head direction
    ``(copies, D)`` and constant ``(copies,)``: the relevance starts at the final hidden state of ``at[c]``; a pooled
    read-out's direction on every final state ``(copies, T, D)`` (:func:`.head.spread`)."""
    output = model(**kwargs)  # an encoder head's relevance starts at the recorded final states: its output unread
    copies = torch.arange(len(at), device=at.device)
    if head is None:
        logits = output.logits
        refuse_non_finite_forward(model, logits.detach(), decoder_mask(kwargs))

        def difference(scores):
            return scores[copies, at, ids] - (0 if foils is None else scores[copies, at, foils])

        objective = difference(recorded.get("logits", logits))
        explained = final = objective.detach()
        final = difference(logits.detach())
    else:
        direction, constant = head
        final = recorded["final"][copies] if direction.dim() == 3 else recorded["final"][copies, at]  # pooled: all
        objective = (final * direction.to(final.dtype)).flatten(1).sum(-1)
        explained = final = objective.detach() + constant.to(objective.dtype)
    return input_relevance(recorded, objective), explained, final


def input_relevance(recorded: dict[str, torch.Tensor], objective: torch.Tensor) -> dict[str, torch.Tensor]:
    r"""One backward pass from ``objective`` ``(copies,)`` inside :func:`lrp_pass`: each stack's token relevances
    ``(copies, tokens)``, :math:`h^0_j \cdot \tilde g_j` at its first block's input, plus :math:`d^l_j \cdot
    \tilde g^{l+1}_j` of each vector the stack adds at position :math:`j` between its blocks (our extension: the
    added vector's relevance is its position's, as the embedding's is)."""
    names = [name for name in ("decoder", "encoder") if name in recorded]
    added = {name: recorded[f"{name} injected"] for name in names if f"{name} injected" in recorded}
    leaves = [recorded[name] for name in names] + [leaf for leaves, _ in added.values() for leaf in leaves]
    grads = list(torch.autograd.grad(objective.sum(), leaves, allow_unused=True))
    relevance = {name: (recorded[name] * grads.pop(0)).sum(-1).detach() for name in names}
    for name, (vectors, mask) in added.items():
        for vector, grad in zip(vectors, grads[: len(vectors)], strict=True):
            if grad is not None:  # a vector no explained logit reads (added after the explained positions' reach)
                relevance[name] += InjectedInputs.scattered((vector * grad).sum(-1).detach(), mask).to(
                    relevance[name].dtype
                )
        del grads[: len(vectors)]
    return relevance
