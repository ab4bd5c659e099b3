"""ALBERT: one block's weights shared by every layer (or by each group of layers), embeddings projected from
``embedding_size`` to ``hidden_size`` before the first block (decompositions start after that projection).

The spec lists the block once per layer, in call order: the trace records each call of a shared module into its own
layer. Post-LN: the attention module computes ``LayerNorm(input + dense(attention))`` inside (the attention output is
read at ``dense``), then the FFN (``ffn``, activation, ``ffn_output``) and ``full_layer_layer_norm``.
"""

from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec, attention
from .encoder_heads import HeadPaths, head_spec

FAMILY = "ALBERT (encoder-only)"
MODEL_TYPES = {"albert"}

HEADS: HeadPaths = {
    "masked_lm": ("predictions.dense", "predictions.activation", "predictions.LayerNorm", "predictions.decoder"),
    "sequence_classification": ("albert.pooler", "albert.pooler_activation", "classifier"),
    "token_classification": ("classifier",),
}


def layer_spec(layer: nn.Module) -> LayerSpec:
    attn = layer.attention
    heads = (attn.num_attention_heads, attn.num_attention_heads, attn.attention_head_size)
    self_attn = attention(
        attn, attn.value, attn.dense, heads, attn.LayerNorm, pre_norm=False, output_module=attn.dense
    )
    return LayerSpec(
        module=layer,
        self_attn=self_attn,
        ffn=FFNSpec(forward=layer.ff_chunk, norm=layer.full_layer_layer_norm, pre_norm=False, w_in=layer.ffn,
                    w_out=layer.ffn_output, activation=layer.activation),
    )  # fmt: skip


def build(model: nn.Module) -> ModelSpec:
    config, encoder = model.config, model.base_model.encoder
    per_group = config.num_hidden_layers // config.num_hidden_groups
    layers = []
    for index in range(config.num_hidden_layers):
        group = encoder.albert_layer_groups[index // per_group]
        layers += [layer_spec(layer) for layer in group.albert_layers]
    return ModelSpec(
        family="albert",
        decoder=StackSpec(layers=layers),
        max_positions=config.max_position_embeddings,
        causal=False,
        head=head_spec(model, HEADS),
    )
