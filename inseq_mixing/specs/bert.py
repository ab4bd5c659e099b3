"""BERT-style encoders: BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA (discriminators and generators).

Post-LN blocks: ``attention.self`` (query/key/value, softmax) then ``attention.output`` (dense, then
``LayerNorm(dense + input)``), ``intermediate`` (dense + activation) and ``output`` (dense, then
``LayerNorm(dense + input)``). The attention module adds the residual and normalises inside, so the attention output
is read at ``attention.output.dense``. ELECTRA generators project their embeddings (``embeddings_project``) before
the first block: decompositions start at the first block's input, after that projection.
"""

import torch
from torch import nn
from transformers.activations import gelu

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec
from .base import attention as attn_spec
from .encoder_heads import HeadPaths, head_spec

FAMILY = "BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA (encoder-only)"
MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "camembert", "electra"}

_TOKEN = ("classifier",)
HEADS: dict[str, HeadPaths] = {
    "bert": {
        "masked_lm": ("cls.predictions.transform.dense", "cls.predictions.transform.transform_act_fn",
                      "cls.predictions.transform.LayerNorm", "cls.predictions.decoder"),
        "sequence_classification": ("bert.pooler.dense", "bert.pooler.activation", "classifier"),
        "token_classification": _TOKEN,
    },
    "roberta": {
        "masked_lm": ("lm_head.dense", gelu, "lm_head.layer_norm", "lm_head.decoder"),
        "sequence_classification": ("classifier.dense", torch.tanh, "classifier.out_proj"),
        "token_classification": _TOKEN,
    },
    "electra": {
        "masked_lm": ("generator_predictions.dense", "generator_predictions.activation",
                      "generator_predictions.LayerNorm", "generator_lm_head"),
        "sequence_classification": ("classifier.dense", "classifier.activation", "classifier.out_proj"),
        "token_classification": _TOKEN,
    },
}  # fmt: skip


def layer_spec(layer: nn.Module) -> LayerSpec:
    attention, output = layer.attention.self, layer.attention.output
    heads = (attention.num_attention_heads, attention.num_attention_heads, attention.attention_head_size)
    self_attn = attn_spec(attention, attention.value, output.dense, heads, output.LayerNorm, pre_norm=False,
                          output_module=output.dense)  # fmt: skip

    def ffn(hidden):
        return layer.output.dense(layer.intermediate(hidden))

    ffn_spec = FFNSpec(
        forward=ffn,
        norm=layer.output.LayerNorm,
        pre_norm=False,
        w_in=layer.intermediate.dense,
        w_out=layer.output.dense,
        activation=layer.intermediate.intermediate_act_fn,
    )
    return LayerSpec(module=layer, self_attn=self_attn, ffn=ffn_spec)


def longest_input(model: nn.Module) -> int:
    """The most tokens the position table covers: RoBERTa's family counts positions from ``padding_idx + 1`` (so
    roberta-base, XLM-R and CamemBERT, with 514 entries, read 512 tokens); BERT and ELECTRA from 0."""
    embeddings = model.base_model.embeddings
    offset = embeddings.padding_idx + 1 if hasattr(embeddings, "create_position_ids_from_input_ids") else 0
    return model.config.max_position_embeddings - offset


def build(model: nn.Module) -> ModelSpec:
    base = model.base_model
    family = {"xlm-roberta": "roberta", "camembert": "roberta"}.get(model.config.model_type, model.config.model_type)
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(layers=[layer_spec(layer) for layer in base.encoder.layer]),
        max_positions=longest_input(model),
        causal=False,
        head=head_spec(model, HEADS[family]),
    )
