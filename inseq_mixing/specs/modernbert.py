"""ModernBERT: pre-LN blocks with an identity first attention norm (the first layer's attention reads the embeddings,
which are normalised inside the embedding module), a fused ``Wqkv`` projection (values: its last third), rotary
positions, alternating global and sliding-window layers (inside the recorded attention probabilities: outside a
window every method gives exactly 0), a GeGLU FFN whose ``Wi`` holds the activated half first, then the linear half,
and a final norm. Classifiers that pool by ``"mean"`` average every position before their head, which is not one
position's read-out: refused; ``"cls"`` pooling reads the first token."""

from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, SlicedLinear, StackSpec, UnsupportedModelError, attention
from .encoder_heads import HeadPaths, head_spec

FAMILY = "ModernBERT (encoder-only)"
MODEL_TYPES = {"modernbert"}

_HEAD = ("head.dense", "head.act", "head.norm")
HEADS: HeadPaths = {
    "masked_lm": (*_HEAD, "decoder"),
    "sequence_classification": (*_HEAD, "classifier"),
    "token_classification": (*_HEAD, "classifier"),
}


def layer_spec(layer: nn.Module) -> LayerSpec:
    attn, mlp = layer.attn, layer.mlp
    heads, width = attn.config.num_attention_heads, attn.config.hidden_size
    norm = None if isinstance(layer.attn_norm, nn.Identity) else layer.attn_norm
    values = slice(2 * width, 3 * width)
    inner = mlp.Wo.in_features
    return LayerSpec(
        module=layer,
        self_attn=attention(attn, attn.Wqkv, attn.Wo, (heads, heads, attn.head_dim), norm, True, values),
        ffn=FFNSpec(
            forward=mlp,
            norm=layer.mlp_norm,
            pre_norm=True,
            w_in=SlicedLinear(mlp.Wi, slice(inner, 2 * inner)),
            w_gate=SlicedLinear(mlp.Wi, slice(0, inner)),
            w_out=mlp.Wo,
            activation=mlp.act,
        ),
    )


def build(model: nn.Module) -> ModelSpec:
    config, base = model.config, model.base_model
    if type(model).__name__.endswith("ForSequenceClassification") and config.classifier_pooling != "cls":
        raise UnsupportedModelError(
            f"This ModernBERT classifier pools by {config.classifier_pooling!r}: its logit reads the average of every "
            "position, not one position, and inseq-mixing explains one position's read-out. Use "
            "classifier_pooling='cls' models."
        )
    return ModelSpec(
        family="modernbert",
        decoder=StackSpec(layers=[layer_spec(layer) for layer in base.layers], final_norm=base.final_norm),
        causal=False,
        head=head_spec(model, HEADS),
        float64_padding_nan=True,  # transformers' float64 masking of padded rows: NaN reaching the real tokens
    )
