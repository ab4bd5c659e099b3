"""Naive implementations of the definitions, on the real Hugging Face modules, to test the fast math against."""

import inspect

import torch
import torch.nn.functional as F

from inseq_mixing.specs import ModelSpec
from inseq_mixing.specs.base import MixerSpec, ParallelMixers


def forward_with_hooks(model, model_kwargs: dict, handles: list) -> None:
    """Run the model once without gradients, then remove the hook ``handles``, even on failure."""
    takes_it = "use_cache" in inspect.signature(model.forward).parameters and "use_cache" not in model_kwargs
    no_cache = {"use_cache": False} if takes_it else {}
    try:
        with torch.no_grad():
            model(**model_kwargs, **no_cache)
    finally:
        for handle in handles:
            handle.remove()


def capture_layer_calls(model, spec: ModelSpec, model_kwargs: dict) -> dict:
    """Run the model once and keep each layer's call ``(args, kwargs)`` and output, keyed by (stack, layer index).
    A block shared by several layers (ALBERT) gives its k-th call to the k-th of them."""
    calls, handles, keys = {}, [], {}
    stacks = {"decoder": spec.decoder, "encoder": spec.encoder}
    for name, stack in stacks.items():
        if stack is None:
            continue
        for idx, layer in enumerate(stack.layers):
            keys.setdefault(layer.module, []).append((name, idx))
    for module, module_keys in keys.items():
        order = iter(module_keys)

        def hook(_module, args, kwargs, order=order):  # no cache: running a block again must not extend it
            calls[next(order)] = (
                args,
                {
                    key: None if key in ("cache", "past_key_values", "past_key_value") else value
                    for key, value in kwargs.items()
                },
            )

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    forward_with_hooks(model, model_kwargs, handles)
    return calls


def run_layer(layer_module, call) -> torch.Tensor:
    args, kwargs = call
    with torch.no_grad():
        output = layer_module(*args, **kwargs)
    return output[0] if isinstance(output, tuple) else output


def mixer_value_input(mixer) -> tuple[torch.nn.Module, slice | torch.Tensor]:
    """The projection whose output holds a mixer's value input, and where in it: Mamba-2's ``x`` (after the gate),
    LFM2's ``x`` (after its two gates), Qwen3.5's Gated DeltaNet values (after its queries and keys), Qwen3-Next's
    (interleaved per key head: found by its own reordering run on the channels' indices), gated attention's
    ``v_proj`` whole."""
    if hasattr(mixer, "v_proj"):
        return mixer.v_proj, slice(None)
    if hasattr(mixer, "in_proj_qkvz"):
        index = torch.arange(mixer.in_proj_qkvz.out_features, dtype=torch.float)[None, None]
        ba = torch.zeros(1, 1, mixer.in_proj_ba.out_features)
        return mixer.in_proj_qkvz, mixer.fix_query_key_value_ordering(index, ba)[2].flatten().long()
    if hasattr(mixer, "in_proj_qkv"):
        return mixer.in_proj_qkv, slice(2 * mixer.key_dim, None)
    if hasattr(mixer, "intermediate_size"):  # Mamba-2
        return mixer.in_proj, slice(mixer.intermediate_size, 2 * mixer.intermediate_size)
    width = mixer.out_proj.out_features
    return mixer.in_proj, slice(2 * width, 3 * width)


def mixer_value_inputs(mixer) -> list[tuple[torch.nn.Module, slice | torch.Tensor]]:
    """:func:`mixer_value_input` of a mixer, or of each branch of parallel mixers (Falcon-H1's Mamba-2 ``x`` and
    attention's ``v_proj``): zeroing a token's value input zeroes it in every branch."""
    if isinstance(mixer, ParallelMixers):
        return [mixer_value_input(branch.spec.module) for branch in mixer.branches]
    return [mixer_value_input(mixer)]


def naive_value_zeroing(model, spec: ModelSpec, model_kwargs: dict, stack: str, sub_block: str, metric="cosine"):
    """For every layer and token j: zero v_j through a hook on the value projection (a mixer's value input: its slice
    of the input projection, :func:`mixer_value_input`), re-run the layer on its clean input, and measure the distance
    to the clean layer output. Returns ``(layers, positions, tokens)`` for batch 0."""
    calls = capture_layer_calls(model, spec, model_kwargs)
    layers = (spec.decoder if stack == "decoder" else spec.encoder).layers
    per_layer = []
    for idx, layer in enumerate(layers):
        attn = layer.self_attn if sub_block == "self" else layer.cross_attn
        clean = run_layer(layer.module, calls[(stack, idx)])
        num_keys = model_kwargs["input_ids"].shape[1] if sub_block == "cross" or stack == "encoder" else None
        num_keys = num_keys or clean.shape[1]
        if isinstance(attn, MixerSpec):
            inputs = mixer_value_inputs(attn.module)
        else:
            inputs = [(attn.value_proj, attn.value_slice)]
        columns = []
        for j in range(num_keys):
            handles = []
            for projection, channels in inputs:

                def zero_value(module, args, output, j=j, columns=channels):
                    output = output.clone()
                    output[..., j, columns] = 0  # a latent attention's up-projection: (B, 1, T, ·)
                    return output

                handles.append(projection.register_forward_hook(zero_value))
            try:
                corrupted = run_layer(layer.module, calls[(stack, idx)])
            finally:
                for handle in handles:
                    handle.remove()
            if metric == "cosine":
                columns.append(1 - F.cosine_similarity(corrupted[0], clean[0], dim=-1))
            else:
                columns.append((corrupted[0] - clean[0]).norm(dim=-1))
        per_layer.append(torch.stack(columns, dim=-1))
    return torch.stack(per_layer)


def capture_value_inputs(model, spec: ModelSpec, model_kwargs: dict) -> dict:
    """Run the model once and keep the input of every value projection, keyed by (stack, layer, sub-block); a shared
    projection (ALBERT) gives its k-th call to the k-th layer listing it."""
    inputs, handles, keys = {}, [], {}
    for name in ("decoder", "encoder"):
        stack = getattr(spec, name)
        if stack is None:
            continue
        for idx, layer in enumerate(stack.layers):
            for sub_block, attn in (("self", layer.self_attn), ("cross", layer.cross_attn)):
                if attn is not None:
                    keys.setdefault(attn.value_proj, []).append((name, idx, sub_block))
    for module, module_keys in keys.items():
        order = iter(module_keys)

        def hook(_module, args, order=order):
            inputs[next(order)] = args[0].detach()

        handles.append(module.register_forward_pre_hook(hook))
    forward_with_hooks(model, model_kwargs, handles)
    return inputs


def hf_value_vectors(attn, value_input: torch.Tensor) -> torch.Tensor:
    """Batch 0's value vectors ``(keys, kv_heads, head_dim)`` from the HF value projection module."""
    values = attn.value_proj(value_input)
    values = values.reshape(values.shape[0], -1, values.shape[-1])[0, :, attn.value_slice]  # a latent's: (B, 1, T, ·)
    return values.reshape(values.shape[0], attn.num_kv_heads, attn.head_dim)


def hf_attention_part(attn, values: torch.Tensor, probs: torch.Tensor, i: int, j: int) -> torch.Tensor:
    """``Σ_h α^h_ij v^h_j W^h_O``: the HF output projection module on token j's weighted values, minus its bias."""
    group = attn.num_heads // attn.num_kv_heads
    heads = [probs[h, i, j] * values[j, h // group] for h in range(attn.num_heads)]
    return attn.out_proj(torch.cat(heads)) - attn.out_proj(
        torch.zeros(attn.num_heads * attn.head_dim, dtype=values.dtype)
    )


def frozen_layer_norm(norm, real_input: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """A LayerNorm's gain and centring applied to ``part`` with the standard deviation of ``real_input``."""
    std = torch.sqrt(real_input.var(unbiased=False) + norm.eps)
    return norm.weight * (part - part.mean()) / std


def naive_alti_layer(
    model, spec: ModelSpec, trace, model_kwargs: dict, stack: str, idx: int, sub_block: str, per_head: bool = False
):
    """ALTI contributions of one layer's attention sub-block for batch 0, token pair by token pair, from the HF
    value and output projection modules. Returns ``(queries, keys)`` (cross-attention: ``keys + 1``, the last column
    being the decoder residual), rows normalised. With ``per_head``: one part per head and token, the residual a part
    of its own (head index ``H``), ``(H + 1, queries, keys[+1])``, each row normalised over heads and tokens."""
    layer = getattr(spec, stack).layers[idx]
    record = getattr(trace, stack).layers[idx]
    attn = layer.self_attn if sub_block == "self" else layer.cross_attn
    attn_record = record.self_attn if sub_block == "self" else record.cross_attn
    value_input = capture_value_inputs(model, spec, model_kwargs)[(stack, idx, sub_block)]
    with torch.no_grad():
        values = hf_value_vectors(attn, value_input)
        if sub_block == "self":
            residual = record.input[0]
        elif attn.pre_norm:
            residual = record.input[0] + record.self_attn.output[0]
        else:
            residual = layer.self_attn.norm(record.input[0] + record.self_attn.output[0])
        attn_output = attn_record.output[0]
        total = residual + (attn_output if attn.out_norm is None else attn.out_norm(attn_output))
        output = total if attn.pre_norm else attn.norm(total)
        probs = attn_record.probs[0]
        num_heads, num_queries, num_keys = probs.shape
        residual_column = num_keys if sub_block == "cross" else None
        scores = torch.zeros(num_heads + 1, num_queries, num_keys + (sub_block == "cross"))
        head_sets = [[h] for h in range(num_heads)] if per_head else [list(range(num_heads))]
        for i in range(num_queries):
            parts = []  # (head slot, key, part)
            for slot, heads in enumerate(head_sets):
                only = torch.zeros_like(probs)
                only[heads] = probs[heads]
                for j in range(num_keys):
                    part = hf_attention_part(attn, values, only, i, j)
                    if attn.out_norm is not None:  # sandwich / OLMo-2: the output norm, frozen, on every part
                        part = frozen_norm_map(attn.out_norm, attn_output[i])(part)
                    if sub_block == "self" and i == j and not per_head:
                        part = part + residual[i]
                    parts.append((slot, j, part))
            if per_head:
                parts.append((num_heads, i if residual_column is None else residual_column, residual[i]))
            elif residual_column is not None:
                parts.append((0, residual_column, residual[i]))
            for slot, j, part in parts:
                if not attn.pre_norm:
                    part = frozen_norm_map(attn.norm, total[i])(part)
                closeness = output[i].abs().sum() - (output[i] - part).abs().sum()
                scores[slot, i, j] = closeness.clamp(min=0)
        for i in range(num_queries):  # no part closer than the origin: the documented identity row (own stream)
            if scores[:, i].sum() == 0:
                scores[num_heads if per_head else 0, i, i if residual_column is None else residual_column] = 1.0
        scores = scores / scores.sum((0, 2), keepdim=True)
        return scores if per_head else scores[0]


def frozen_norm_map(norm, real_input: torch.Tensor):
    """The linear part of a LayerNorm or RMSNorm at the statistics of ``real_input`` (one position)."""
    if isinstance(norm, torch.nn.LayerNorm):
        return lambda part: frozen_layer_norm(norm, real_input, part)
    if hasattr(norm, "lambda1"):  # a layer scale (DINOv2): linear, the HF module itself
        return norm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    # through the HF module itself: norm(p) = g ⊙ p / rms(p), so g ⊙ p / rms(x) = norm(p) · rms(p) / rms(x)
    rms = torch.sqrt(real_input.pow(2).mean() + eps)
    return lambda part: norm(part) * torch.sqrt(part.pow(2).mean() + eps) / rms


def naive_alti_logit_pre_ln(model, spec: ModelSpec, trace, model_kwargs: dict, rollouts, ids: torch.Tensor):
    """ALTI-logit token scores of batch 0 for a pre-LN model, from the definition: every attention part
    ``out_proj(α v_j) − b_O`` (HF modules) dotted with ``∂ logit / ∂ h`` of the frozen final norm (autograd),
    traced back with the given rollouts (:class:`AltiRollouts` of the trace). Returns (target, source) scores."""
    value_inputs = capture_value_inputs(model, spec, model_kwargs)
    stack, layers = trace.decoder, spec.decoder.layers
    num_positions = stack.layers[0].input.shape[1]
    directions = []
    for t in range(num_positions):
        hidden = stack.layers[-1].output[0, t].clone().requires_grad_(True)
        frozen = frozen_norm_map(spec.decoder.final_norm, hidden.detach()) if spec.decoder.final_norm else None
        final = hidden if frozen is None else frozen(hidden)
        (spec.lm_head.weight[ids[0, t]] @ (final * spec.logits_scale)).backward()
        directions.append(hidden.grad)
    target = torch.zeros(num_positions, num_positions)
    source = None if trace.encoder is None else torch.zeros(num_positions, trace.encoder.layers[0].input.shape[1])
    with torch.no_grad():
        for t in range(num_positions):
            target[t, t] += directions[t] @ stack.layers[0].input[0, t]
        for idx, (layer, record) in enumerate(zip(layers, stack.layers, strict=True)):
            for sub_block, attn, attn_record in (
                ("self", layer.self_attn, record.self_attn),
                ("cross", layer.cross_attn, record.cross_attn),
            ):
                if attn is None:
                    continue
                values = hf_value_vectors(attn, value_inputs[("decoder", idx, sub_block)])
                for t in range(num_positions):
                    for j in range(values.shape[0]):
                        part = hf_attention_part(attn, values, attn_record.probs[0], t, j)
                        if attn.out_norm is not None:  # sandwich / OLMo-2: the output norm, frozen, on every part
                            part = frozen_norm_map(attn.out_norm, attn_record.output[0, t])(part)
                        delta = directions[t] @ part
                        if sub_block == "cross":
                            source[t] += delta * rollouts.encoder[0, j]
                        elif idx == 0:
                            target[t, j] += delta
                        else:
                            target[t] += delta * rollouts.target[0, idx - 1, j]
                            if source is not None:
                                source[t] += delta * rollouts.source[0, idx - 1, j]
    return target, source


class NaiveLrp:
    """AttnLRP written operation by operation, each rule where the paper puts it, with a modified gradient (relevance =
    value × gradient): the division by σ or the rms frozen, the identity rule on activations, half of a product's
    relevance to each factor, the softmax's own gradient. Records every softmax's input and output, so the relevance
    the softmax rule absorbs can be computed."""

    def __init__(self):
        self.softmaxes: list[tuple[torch.Tensor, torch.Tensor]] = []

    @staticmethod
    def layer_norm(norm, x):
        centered = x - x.mean(-1, keepdim=True)
        std = torch.sqrt(centered.pow(2).mean(-1, keepdim=True) + norm.eps)
        return centered / std.detach() * norm.weight + norm.bias

    @staticmethod
    def rms_norm(norm, x):
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return x / rms.detach() * norm.weight

    @staticmethod
    def identity(function, x):
        y = function(x)
        return y.detach() + (y / x).detach() * (x - x.detach())

    @staticmethod
    def product(a, b, combine=torch.mul):
        """``combine(a, b)``, each factor receiving half of the gradient."""
        return 0.5 * (combine(a, b.detach()) + combine(a.detach(), b))

    def attention(self, q, k, v, scale: float, sinks: torch.Tensor | None = None, window: int | None = None):
        """Causal attention over ``(heads, positions, head_dim)``; with ``sinks``, each head's learned logit joins
        the softmax and is dropped after it (GPT-OSS); with ``window``, keys ``window`` or more positions back are
        masked."""
        scores = self.product(q, k.transpose(-1, -2), torch.matmul) * scale
        hidden = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        if window is not None:
            hidden |= torch.ones_like(hidden).tril(-window)
        scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
        scores.retain_grad()
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.detach().reshape(-1, 1, 1).expand(-1, scores.shape[1], 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        probs.retain_grad()
        self.softmaxes.append((scores, probs))
        return self.product(probs, v, torch.matmul)

    def softmax_absorbed(self) -> torch.Tensor:
        """What the softmax rule leaves out: Σ relevance of the outputs − Σ relevance of the inputs, over all rows."""
        total = 0.0
        for scores, probs in self.softmaxes:
            kept = torch.where(probs > 0, scores * scores.grad, torch.zeros_like(scores))
            total = total + (probs * probs.grad).sum() - kept.sum()
        return total


def naive_attn_lrp_gpt2(model, ids: torch.Tensor, position: int, token: int):
    """Relevance of each token of ``ids`` (1-D) for the logit of ``token`` at ``position`` of a GPT-2 model."""
    lrp = NaiveLrp()
    base = model.transformer
    h0 = (base.wte(ids) + base.wpe(torch.arange(len(ids)))).detach().requires_grad_(True)
    hidden = h0
    for block in base.h:
        heads, width = block.attn.num_heads, block.attn.head_dim
        q, k, v = (lrp.layer_norm(block.ln_1, hidden) @ block.attn.c_attn.weight + block.attn.c_attn.bias).split(
            heads * width, dim=-1
        )
        q, k, v = (t.reshape(len(ids), heads, width).transpose(0, 1) for t in (q, k, v))
        mixed = lrp.attention(q, k, v, width**-0.5).transpose(0, 1).reshape(len(ids), -1)
        hidden = hidden + mixed @ block.attn.c_proj.weight + block.attn.c_proj.bias
        inner = lrp.layer_norm(block.ln_2, hidden) @ block.mlp.c_fc.weight + block.mlp.c_fc.bias
        hidden = hidden + lrp.identity(block.mlp.act, inner) @ block.mlp.c_proj.weight + block.mlp.c_proj.bias
    logit = (lrp.layer_norm(base.ln_f, hidden) @ model.lm_head.weight.T)[position, token]
    logit.backward()
    return (h0 * h0.grad).sum(-1), logit.detach(), lrp.softmax_absorbed().detach()


def naive_lrp_gated_ffn(lrp: NaiveLrp, mlp, x: torch.Tensor) -> torch.Tensor:
    """``down(act(gate(x)) ⊙ up(x))`` under the identity and product rules."""
    return mlp.down_proj(lrp.product(lrp.identity(mlp.act_fn, mlp.gate_proj(x)), mlp.up_proj(x)))


def naive_lrp_mixture(lrp: NaiveLrp, block, x: torch.Tensor) -> torch.Tensor:
    """A mixture of experts position by position from the stacked weights, the router's weights (and a shared
    expert's sigmoid gate) constants of the pass, each selected expert a gated FFN under the rules."""
    experts = block.experts
    width = experts.down_proj.shape[-1]
    _, weights, selected = block.gate(x.detach())
    rows = []
    for t in range(x.shape[0]):
        row = torch.zeros_like(x[t])
        for weight, expert in zip(weights[t], selected[t].tolist(), strict=True):
            gate_up = experts.gate_up_proj[expert]
            gated = lrp.product(lrp.identity(experts.act_fn, x[t] @ gate_up[:width].T), x[t] @ gate_up[width:].T)
            row = row + weight.detach() * (gated @ experts.down_proj[expert].T)
        rows.append(row)
    out = torch.stack(rows)
    shared = getattr(block, "shared_expert", None)
    if shared is not None:
        out = out + torch.sigmoid(block.shared_expert_gate(x)).detach() * naive_lrp_gated_ffn(lrp, shared, x)
    return out


def naive_lrp_gpt_oss_experts(lrp: NaiveLrp, block, x: torch.Tensor) -> torch.Tensor:
    """GPT-OSS's mixture position by position from its stacked weights ``(experts, in, out)`` with biases, gate and
    linear outputs interleaved: ``(clamp(up, ±l) + 1) ⊙ g σ(α g)``, ``g = min(gate, l)``, the gate activation and the
    clamp under the identity rule, the product under the uniform rule, the routing weights constants."""
    experts = block.experts
    _, weights, selected = block.router(x.detach())
    alpha, limit = experts.alpha, experts.limit

    def gate_activation(gate):
        gate = gate.clamp(max=limit)
        return gate * torch.sigmoid(gate * alpha)

    rows = []
    for t in range(x.shape[0]):
        row = torch.zeros_like(x[t])
        for weight, expert in zip(weights[t], selected[t].tolist(), strict=True):
            gate_up = x[t] @ experts.gate_up_proj[expert] + experts.gate_up_proj_bias[expert]
            gate = lrp.identity(gate_activation, gate_up[::2])
            linear = lrp.identity(lambda up: up.clamp(-limit, limit), gate_up[1::2]) + 1
            out = lrp.product(gate, linear) @ experts.down_proj[expert] + experts.down_proj_bias[expert]
            row = row + weight.detach() * out
        rows.append(row)
    return torch.stack(rows)


def naive_lrp_ffn(lrp: NaiveLrp, mlp, x: torch.Tensor) -> torch.Tensor:
    """A Llama-layout block's FFN under the rules: dense and gated, a mixture of experts, or GPT-OSS's mixture."""
    if hasattr(mlp, "router"):
        return naive_lrp_gpt_oss_experts(lrp, mlp, x)
    if hasattr(mlp, "experts"):
        return naive_lrp_mixture(lrp, mlp, x)
    return naive_lrp_gated_ffn(lrp, mlp, x)


def naive_attn_lrp_llama(model, ids: torch.Tensor, position: int, token: int):
    """Relevance of each token of ``ids`` (1-D) for the logit of ``token`` at ``position`` of a Llama-layout model:
    RMSNorms, rotary embeddings, grouped-query attention (GPT-OSS's with biases, learned sinks and sliding windows),
    SwiGLU or a mixture of experts (GPT-OSS's clamped ones)."""
    import sys

    lrp = NaiveLrp()
    base = model.model
    h0 = base.embed_tokens(ids).detach().requires_grad_(True)
    cos, sin = base.rotary_emb(h0[None], torch.arange(len(ids))[None])
    hidden = h0
    for layer in base.layers:
        attn = layer.self_attn
        rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb  # the family's own layout of cos and sin
        x = lrp.rms_norm(layer.input_layernorm, hidden)
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        q, k, v = (proj(x).reshape(len(ids), -1, attn.head_dim).transpose(0, 1) for proj in projections)
        q, k = rotary(q[None], k[None], cos, sin)
        groups = q.shape[1] // k.shape[1]
        k, v = k[0].repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
        sinks, window = getattr(attn, "sinks", None), getattr(attn, "sliding_window", None)
        mixed = lrp.attention(q[0], k, v, attn.scaling, sinks, window).transpose(0, 1).reshape(len(ids), -1)
        hidden = hidden + attn.o_proj(mixed)
        hidden = hidden + naive_lrp_ffn(lrp, layer.mlp, lrp.rms_norm(layer.post_attention_layernorm, hidden))
    logit = model.lm_head(lrp.rms_norm(base.norm, hidden))[position, token]
    logit.backward()
    return (h0 * h0.grad).sum(-1), logit.detach(), lrp.softmax_absorbed().detach()
