"""DistilBERT: post-LN blocks whose attention module returns the output-projected attention (``out_lin``), then
``sa_layer_norm(attention + input)``, the FFN (``lin1``, activation, ``lin2``) and ``output_layer_norm``."""

import torch
from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec, attention
from .encoder_heads import HeadPaths, head_spec

FAMILY = "DistilBERT (encoder-only)"
MODEL_TYPES = {"distilbert"}

HEADS: HeadPaths = {
    "masked_lm": ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),
    "sequence_classification": ("pre_classifier", torch.relu, "classifier"),
    "token_classification": ("classifier",),
}


def layer_spec(block: nn.Module) -> LayerSpec:
    attn = block.attention
    heads = (attn.n_heads, attn.n_heads, attn.attention_head_size)
    ffn = block.ffn
    return LayerSpec(
        module=block,
        self_attn=attention(attn, attn.v_lin, attn.out_lin, heads, block.sa_layer_norm, pre_norm=False),
        ffn=FFNSpec(forward=ffn, norm=block.output_layer_norm, pre_norm=False, w_in=ffn.lin1, w_out=ffn.lin2,
                    activation=ffn.activation),
    )  # fmt: skip


def build(model: nn.Module) -> ModelSpec:
    base = model.base_model
    return ModelSpec(
        family="distilbert",
        decoder=StackSpec(layers=[layer_spec(block) for block in base.transformer.layer]),
        max_positions=model.config.max_position_embeddings,
        causal=False,
        head=head_spec(model, HEADS),
    )
