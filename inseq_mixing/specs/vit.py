"""Vision Transformers with the ViT block layout: ViT and DeiT (image classifiers and bare encoders).

The image is cut into patches by a convolution whose stride is its kernel (each patch embedded on its own pixels:
nothing mixes between patches there), then [CLS] (and DeiT's distillation token) is prepended and the position
embeddings added. Decompositions start at the first block's input, after that. Pre-LN blocks: ``layernorm_before``,
``attention`` (``q_proj`` / ``k_proj`` / ``v_proj``, softmax, ``o_proj``), residual; ``layernorm_after``, ``mlp``
(``fc1``, activation, ``fc2``), residual; a final ``layernorm``. ``...ForImageClassification`` reads [CLS] after
the final norm through one linear ``classifier`` (a sequence classifier's head, position 0); the bare encoder
(``ViTModel``, ``DeiTModel``) gives the map methods only. DeiT's classifier with its teacher
(``DeiTForImageClassificationWithTeacher``) averages a [CLS] head and a distillation head read at [DIST]: a pooled
read-out of the two positions through one averaged linear map (:class:`AveragedHeads`), so the logit methods stay
complete.
"""

import torch
from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec
from .base import attention as attn_spec
from .encoder_heads import head_spec, pooled_head_spec

FAMILY = "ViT, DeiT (vision)"
KIND = "vision"
MODEL_TYPES = {"vit", "deit"}

HEADS = {"sequence_classification": ("classifier",)}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    attention, mlp = layer.attention, layer.mlp
    heads = (config.num_attention_heads, config.num_attention_heads, config.hidden_size // config.num_attention_heads)
    return LayerSpec(
        module=layer,
        self_attn=attn_spec(attention, attention.v_proj, attention.o_proj, heads, layer.layernorm_before, True),
        ffn=FFNSpec(
            forward=mlp,
            norm=layer.layernorm_after,
            pre_norm=True,
            w_in=mlp.fc1,
            w_out=mlp.fc2,
            activation=mlp.activation_fn,
        ),
    )


class AveragedHeads(nn.Module):
    """DeiT's classifier with its teacher as one linear map of [CLS] beside [DIST]: ``(W_cls h_0 + W_dist h_1) / 2``
    (its weight and bias read from the model's two heads at every use)."""

    def __init__(self, cls_head: nn.Linear, distillation_head: nn.Linear):
        super().__init__()
        self.heads = [cls_head, distillation_head]  # in a list: the model's modules, not this one's

    @property
    def weight(self) -> torch.Tensor:
        return torch.cat([head.weight for head in self.heads], dim=1) / 2

    @property
    def bias(self) -> torch.Tensor:
        return (self.heads[0].bias + self.heads[1].bias) / 2

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.weight, self.bias)


def build(model: nn.Module) -> ModelSpec:
    if type(model).__name__.endswith("WithTeacher"):  # [CLS] and [DIST], each through its own head, averaged
        head = pooled_head_spec((0, 1), 2, (AveragedHeads(model.cls_classifier, model.distillation_classifier),))
    else:
        head = head_spec(model, HEADS)
    base = model.base_model
    layers = [layer_spec(layer, model.config) for layer in base.layers]
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(layers=layers, final_norm=base.layernorm),
        causal=False,
        head=head,
    )
