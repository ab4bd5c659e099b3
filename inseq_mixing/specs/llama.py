"""Llama-style decoders (Llama, Mistral, Qwen2, Qwen3): pre-RMSNorm, RoPE, grouped-query attention, SwiGLU FFN.

Qwen3's q/k norms act inside attention, on queries and keys only: they shape the recorded attention probabilities and
leave the value path (what the methods decompose) as in Llama.
"""

from torch import nn

from .base import AttentionSpec, FFNSpec, LayerSpec, ModelSpec, StackSpec, attention

FAMILY = "Llama-style (Llama, Mistral, Qwen2, Qwen3)"
MODEL_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


def attention_spec(layer: nn.Module, config, value_proj: nn.Module, value_slice: slice = slice(None)) -> AttentionSpec:
    """The self-attention of a Llama-layout block whose values are ``value_proj``'s outputs ``value_slice``."""
    attn = layer.self_attn
    heads = (config.num_attention_heads, config.num_key_value_heads, attn.head_dim)
    return attention(attn, value_proj, attn.o_proj, heads, layer.input_layernorm, True, value_slice)


def gated_ffn(layer: nn.Module, w_in: nn.Module, w_gate: nn.Module, activation) -> FFNSpec:
    """The gated FFN sub-block of a Llama-layout block: ``down_proj(activation(w_gate(x)) * w_in(x))``."""
    return FFNSpec(
        forward=layer.mlp,
        norm=layer.post_attention_layernorm,
        pre_norm=True,
        w_in=w_in,
        w_out=layer.mlp.down_proj,
        activation=activation,
        w_gate=w_gate,
    )


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    mlp = layer.mlp
    return LayerSpec(
        module=layer,
        self_attn=attention_spec(layer, config, layer.self_attn.v_proj),
        ffn=gated_ffn(layer, mlp.up_proj, mlp.gate_proj, mlp.act_fn),
    )


def build(model: nn.Module, layer_spec=layer_spec) -> ModelSpec:
    """The spec of a Llama-layout decoder; ``layer_spec`` builds each block's (families with other projections)."""
    base = model.base_model
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(layers=[layer_spec(layer, model.config) for layer in base.layers], final_norm=base.norm),
        lm_head=model.get_output_embeddings(),
    )
