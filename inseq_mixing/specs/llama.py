"""Llama-style decoders (Llama, Mistral, Qwen2, Qwen3): pre-RMSNorm, RoPE, grouped-query attention, SwiGLU FFN.

Qwen3's q/k norms act inside attention, on queries and keys only: they shape the recorded attention probabilities and
leave the value path (what the methods decompose) as in Llama.
"""

from torch import nn

from .base import AttentionSpec, FFNSpec, LayerSpec, ModelSpec, StackSpec, attention

FAMILY = "Llama-style (Llama, Mistral, Qwen2, Qwen3)"
MODEL_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


def attention_spec(
    layer: nn.Module,
    config,
    value_proj: nn.Module,
    value_slice: slice = slice(None),
    norms: tuple[nn.Module | None, nn.Module | None] | None = None,
) -> AttentionSpec:
    """The self-attention of a Llama-layout block whose values are ``value_proj``'s outputs ``value_slice``;
    ``norms`` = (input norm, output norm), by default ``(input_layernorm, None)``."""
    attn = layer.self_attn
    heads = (config.num_attention_heads, config.num_key_value_heads, attn.head_dim)
    in_norm, out_norm = norms or (layer.input_layernorm, None)
    return attention(attn, value_proj, attn.o_proj, heads, in_norm, True, value_slice, out_norm)


def gated_ffn(
    layer: nn.Module,
    w_in: nn.Module,
    w_gate: nn.Module,
    activation,
    norms: tuple[nn.Module | None, nn.Module | None] | None = None,
) -> FFNSpec:
    """The gated FFN sub-block of a Llama-layout block: ``down_proj(activation(w_gate(x)) * w_in(x))``; ``norms`` =
    (input norm, output norm), by default ``(post_attention_layernorm, None)``."""
    in_norm, out_norm = norms or (layer.post_attention_layernorm, None)
    return FFNSpec(
        forward=layer.mlp,
        norm=in_norm,
        pre_norm=True,
        w_in=w_in,
        w_out=layer.mlp.down_proj,
        activation=activation,
        w_gate=w_gate,
        out_norm=out_norm,
    )


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    mlp = layer.mlp
    return LayerSpec(
        module=layer,
        self_attn=attention_spec(layer, config, layer.self_attn.v_proj),
        ffn=gated_ffn(layer, mlp.up_proj, mlp.gate_proj, mlp.act_fn),
    )


def build(model: nn.Module, layer_spec=layer_spec, final_norm: str = "norm", **model_fields) -> ModelSpec:
    """The spec of a Llama-layout decoder; ``layer_spec`` builds each block's (families with other projections or
    norms), ``final_norm`` names the base model's final norm, ``model_fields`` sets other :class:`ModelSpec`
    fields."""
    base = model.base_model
    layers = [layer_spec(layer, model.config) for layer in base.layers]
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(layers=layers, final_norm=getattr(base, final_norm)),
        lm_head=model.get_output_embeddings(),
        **model_fields,
    )
