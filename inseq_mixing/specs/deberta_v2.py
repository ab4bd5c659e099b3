"""DeBERTa-v2 / v3: BERT-like post-LN blocks whose disentangled attention adds content-to-position and
position-to-content terms to the attention scores only, so the recorded probabilities carry them and nothing else
changes for the methods. Its attention returns probabilities only when asked (``output_attentions``). A model with a
convolution beside the first block (``conv_kernel_size > 0``) mixes tokens outside attention: refused."""

from torch import nn
from transformers.activations import ACT2FN

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec, UnsupportedModelError
from .base import attention as attn_spec
from .encoder_heads import HeadPaths, head_spec

FAMILY = "DeBERTa-v2 / v3 (encoder-only)"
MODEL_TYPES = {"deberta-v2"}


class TiedDecoder(nn.Module):
    """DeBERTa-v2's masked-LM read-out: the word embeddings' transpose plus the head's bias, as one linear map."""

    def __init__(self, embeddings: nn.Embedding, bias: nn.Parameter):
        super().__init__()
        self.embeddings, self.bias = embeddings, bias

    @property
    def weight(self):
        return self.embeddings.weight

    @property
    def out_features(self) -> int:
        return self.embeddings.num_embeddings

    def forward(self, hidden):
        return nn.functional.linear(hidden, self.weight, self.bias)


def heads(model: nn.Module) -> HeadPaths:
    config = model.config
    if getattr(config, "legacy", True):
        masked = ("cls.predictions.transform.dense", "cls.predictions.transform.transform_act_fn",
                  "cls.predictions.transform.LayerNorm", "cls.predictions.decoder")  # fmt: skip
    else:
        head = model.lm_predictions.lm_head if hasattr(model, "lm_predictions") else None
        decoder = None if head is None else TiedDecoder(model.get_input_embeddings(), head.bias)
        masked = ("lm_predictions.lm_head.dense", "lm_predictions.lm_head.transform_act_fn",
                  "lm_predictions.lm_head.LayerNorm", decoder)  # fmt: skip
    return {
        "masked_lm": masked,
        "sequence_classification": ("pooler.dense", ACT2FN[config.pooler_hidden_act], "classifier"),
        "token_classification": ("classifier",),
    }


def layer_spec(layer: nn.Module) -> LayerSpec:
    attention, output = layer.attention.self, layer.attention.output
    heads_ = (attention.num_attention_heads, attention.num_attention_heads, attention.attention_head_size)

    def ffn(hidden):
        return layer.output.dense(layer.intermediate(hidden))

    return LayerSpec(
        module=layer,
        self_attn=attn_spec(attention, attention.value_proj, output.dense, heads_, output.LayerNorm, pre_norm=False,
                            output_module=output.dense),
        ffn=FFNSpec(forward=ffn, norm=layer.output.LayerNorm, pre_norm=False, w_in=layer.intermediate.dense,
                    w_out=layer.output.dense, activation=layer.intermediate.intermediate_act_fn),
    )  # fmt: skip


def build(model: nn.Module) -> ModelSpec:
    config, encoder = model.config, model.base_model.encoder
    if getattr(config, "conv_kernel_size", 0) > 0:
        raise UnsupportedModelError(
            "This DeBERTa-v2 model has a convolution beside its first block (conv_kernel_size > 0): it mixes "
            "neighbouring tokens outside attention, which no context-mixing decomposition accounts for."
        )
    return ModelSpec(
        family="deberta-v2",
        decoder=StackSpec(layers=[layer_spec(layer) for layer in encoder.layer]),
        max_positions=config.max_position_embeddings if getattr(config, "position_biased_input", False) else None,
        causal=False,
        head=head_spec(model, heads(model)),
        output_attentions=True,
    )
