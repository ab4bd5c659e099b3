"""The one place that decides what kind a model is, and the one ``load_model`` every entry point calls.

Four kinds, each with its front end:

- ``"generation"``: encoder–decoders and decoder-only models (``...ForConditionalGeneration``, ``...ForCausalLM``,
  ``...LMHeadModel``, ``"demo"``, the embedded demo model, and ``"demo-retrieval"``, the retrieval demo model): Inseq's
  own ``AttributionModel`` with this package's method classes (:mod:`.inseq_adapter`);
- ``"encoder"``: encoder-only models of a supported family (masked LMs, classifiers, token classifiers, bare encoders):
  :class:`~.encoders.EncoderAttributionModel`;
- ``"speech"``: Whisper, wav2vec 2.0 and HuBERT (with CTC heads or bare): :class:`~.speech.SpeechAttributionModel`;
- ``"vision"``: ViT, DeiT, DINOv2, BEiT, Data2Vec-vision, CLIP's and SigLIP's image towers (image classifiers, bare
  encoders, CLIP's image–text similarity): :class:`~.vision.VisionAttributionModel`.

:func:`identify` reads a name's or folder's config once and says its kind; :func:`load_model` takes what
:func:`identify` found (or finds it) and builds the front end. The dataset runner, ``evaluate``, ``compare`` and the
CLI call these two and never test a model's kind themselves. A new front end adds its kind here: one line in
:func:`kind_of_config` and one in :func:`load_model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENERATION, ENCODER, SPEECH, VISION = "generation", "encoder", "speech", "vision"

#: The model types of the speech families.
SPEECH_MODEL_TYPES = ("whisper", "wav2vec2", "hubert")
#: The model types of the vision families.
VISION_MODEL_TYPES = ("vit", "deit", "dinov2", "dinov2_with_registers", "beit", "data2vec-vision", "clip",
                      "clip_vision_model", "siglip", "siglip_vision_model", "siglip2",
                      "siglip2_vision_model")  # fmt: skip

#: Class-name endings of generation models (the head a config was saved with, or a model object's class).
GENERATION_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


@dataclass(frozen=True)
class ModelKind:
    """What :func:`identify` found: the kind, the config's ``model_type``, and the config it read (None for the
    demo model, or for a name whose config could not be read: its loader then says why)."""

    kind: str
    model_type: str | None = None
    config: Any = None

    @property
    def is_speech(self) -> bool:
        return self.kind == SPEECH

    @property
    def is_vision(self) -> bool:
        return self.kind == VISION

    @property
    def is_encoder(self) -> bool:
        return self.kind == ENCODER

    @property
    def is_generation(self) -> bool:
        return self.kind == GENERATION

    @property
    def run_columns(self) -> tuple[str, str]:
        """A dataset run's default source and target columns: ``source`` / ``target``; speech models ``audio`` and
        ``transcript`` (Whisper) or ``frames`` (CTC and bare encoders); vision models ``image`` and ``label`` (CLIP:
        the text)."""
        if self.is_speech:
            return "audio", "transcript" if self.model_type == "whisper" else "frames"
        if self.is_vision:
            return "image", "label"
        return "source", "target"

    @property
    def reads_words(self) -> bool:
        """Whether a dataset run's rows may give word intervals (speech models' audio words)."""
        return self.is_speech


def kind_of_config(config, class_name: str | None = None) -> str:
    """The kind of a model from its config (and, for a model object, its class name). A model that is neither speech
    nor generation goes to the encoder front end, which names what it does not support."""
    model_type = getattr(config, "model_type", None)
    if model_type in SPEECH_MODEL_TYPES:
        return SPEECH
    if model_type in VISION_MODEL_TYPES:
        return VISION
    names = [class_name] if class_name is not None else list(getattr(config, "architectures", None) or [])
    if getattr(config, "is_encoder_decoder", False) or any(name.endswith(GENERATION_SUFFIXES) for name in names):
        return GENERATION
    return ENCODER


def identify(model) -> ModelKind:
    """The kind of ``model``: a front-end object, an Inseq model, a Hugging Face model, ``"demo"``, or a hub name or
    local folder (whose config is read once here)."""
    from torch import nn

    from .common import FrontEndModel

    if isinstance(model, FrontEndModel):
        config = model.model.config
        return ModelKind(_front_end_kind(model), config.model_type, config)
    inner = getattr(model, "model", None)  # an Inseq AttributionModel holds its HF model here
    if _is_inseq_model(model) and isinstance(inner, nn.Module):
        return ModelKind(GENERATION, getattr(inner.config, "model_type", None), inner.config)
    if isinstance(model, nn.Module):
        config = getattr(model, "config", None)
        if config is None:
            return ModelKind(GENERATION)
        return ModelKind(kind_of_config(config, type(model).__name__), getattr(config, "model_type", None), config)
    if isinstance(model, str | Path) and str(model) != "demo":
        config = read_config(demo_folder(str(model)))
        if config is not None:
            return ModelKind(kind_of_config(config), getattr(config, "model_type", None), config)
    return ModelKind(GENERATION)


def inseq_refusal(model, method: str | None) -> str | None:
    """Why ``inseq.load_model`` cannot take ``model`` and what to call instead (a speech model, or an encoder-only
    one: a family with a masked-LM head in transformers, not a bare decoder), or None for a model Inseq takes or whose
    kind cannot be told (its config cannot be read)."""
    try:
        found = identify(model)
    except Exception:  # noqa: BLE001  (a model this cannot tell the kind of is Inseq's to refuse or load)
        return None
    if not found.is_speech and not found.is_vision and not (found.is_encoder and _encoder_only(found.model_type)):
        return None
    kind, companion = {SPEECH: ("a speech", "processor"), VISION: ("a vision", "processor")}.get(
        found.kind, ("an encoder-only", "tokenizer")
    )
    return (
        f"inseq.load_model loads generation models, and this is {kind} model ({found.model_type}): use "
        f"inseq_mixing.load_model(model, {method or 'METHOD'!r}, {companion}=...), whose .attribute() gives Inseq "
        "output."
    )


def _encoder_only(model_type: str | None) -> bool:
    """Whether a model type is an encoder-only family (transformers has a masked-LM head for it); a bare decoder
    (``LlamaModel``) is not."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def read_config(name: str):
    """The config of a hub name or local folder, or None when it cannot be read (a missing folder, no network)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name)
    except (OSError, ValueError):
        return None


def load_model(
    model,
    method: str,
    *,
    tokenizer=None,
    processor=None,
    device: str | None = None,
    dtype=None,
    found: ModelKind | None = None,
    **kwargs,
):
    """One entry point for every kind of model.

    Encoder–decoders and decoder-only models go to ``inseq.load_model`` unchanged (``"demo"`` is the embedded demo
    model); encoder-only models (``...ForMaskedLM``, ``...ForSequenceClassification``, ``...ForTokenClassification``,
    or a bare encoder such as ``BertModel``) get an :class:`~inseq_mixing.frontends.encoders.EncoderAttributionModel`;
    speech models (Whisper, ``Wav2Vec2ForCTC``, ``HubertForCTC`` and their bare encoders) a
    :class:`~inseq_mixing.frontends.speech.SpeechAttributionModel`. A front-end object or an Inseq model is given the
    method (another method on the same model keeps its tokenizer or processor).

    Args:
        model: A hub name or local folder, ``"demo"``, a loaded Hugging Face model, an Inseq model or a front end of
            this package.
        method: One of this package's methods, or ``integrated_gradients``, ``deeplift``, ``saliency``,
            ``input_x_gradient`` (Captum's, on encoder-only models too).
        tokenizer: The tokenizer (default: loaded from the model's name or folder).
        processor: Speech models: the processor (feature extractor and tokenizer); vision models: the image
            processor (default: loaded from the model's name or folder).
        device: e.g. ``"cpu"`` or ``"cuda"``.
        dtype: e.g. ``torch.bfloat16``.
        found: What :func:`identify` found for ``model``, when the caller asked already (its config is not read
            again).
        kwargs: Passed to ``inseq.load_model`` for generation models.
    """
    from ..specs import MIXING_OUTSIDE_ATTENTION, get_spec
    from .encoders import EncoderAttributionModel
    from .speech import SpeechAttributionModel
    from .vision import VisionAttributionModel

    found = found or identify(model)
    if isinstance(model, SpeechAttributionModel):
        return model if model.method == method else model.for_method(method)
    if isinstance(model, VisionAttributionModel):
        return model if model.method == method else VisionAttributionModel(model.model, model.processor, method)
    if isinstance(model, EncoderAttributionModel):
        return model if model.method == method else EncoderAttributionModel(model.model, model.tokenizer, method)
    if _is_inseq_model(model):
        if device is not None:
            model.device = device
        model.attribution_method = model.get_attribution_method(method)
        return model
    if found.is_generation:
        return _generation_model(model, method, tokenizer, device, dtype, **kwargs)
    if isinstance(model, str | Path):
        model, tokenizer, processor = _load_front_end_model(str(model), found, tokenizer, processor)
    if found.model_type in MIXING_OUTSIDE_ATTENTION:
        get_spec(model)  # refused, with what mixes its tokens outside attention, before asking for anything else
    if (found.is_speech or found.is_vision) and processor is None:
        raise ValueError(f"Pass the processor of this {found.kind} model: load_model(model, method, processor=...).")
    if found.is_encoder and tokenizer is None:
        raise ValueError("Pass the tokenizer of this encoder model: load_model(model, method, tokenizer=...).")
    if found.is_speech:
        front = SpeechAttributionModel(model, processor, method)
    elif found.is_vision:
        front = VisionAttributionModel(model, processor, method)
    else:
        front = EncoderAttributionModel(model, tokenizer, method)
    # converted only once every check passed: a refused call leaves the caller's model as it was
    if dtype is not None:
        model.to(dtype)
    if device is not None:
        model.to(device)
    return front


def demo_folder(name: str) -> str:
    """``"demo-retrieval"``: the folder of the embedded retrieval demo model (:mod:`inseq_mixing.demo.retrieval`);
    any other name as it is."""
    if name == "demo-retrieval":
        from ..demo import RETRIEVAL_MODEL_DIR

        return str(RETRIEVAL_MODEL_DIR)
    return name


def is_front_end(model) -> bool:
    """Whether ``model`` is a front end already: an Inseq model, or one of this package's front ends (not a Hugging
    Face model, nor a name)."""
    from .common import FrontEndModel

    return isinstance(model, FrontEndModel) or _is_inseq_model(model)


def as_front_end(model, method: str, found: ModelKind | None = None, **kwargs):
    """``model`` itself when it is a front end already (:func:`is_front_end`: its method left as it is), otherwise
    :func:`load_model` of it with ``method`` and ``kwargs``."""
    if is_front_end(model):
        return model
    return load_model(model, method, found=found, **kwargs)


def _generation_model(model, method: str, tokenizer, device, dtype, **kwargs):
    """Inseq's model with ``method`` (``"demo"``: the embedded demo model), converted to ``dtype``."""
    import inseq
    from torch import nn

    from .patches import register

    register()
    if tokenizer is None and not isinstance(model, str | Path):
        raise ValueError("Pass the tokenizer of this model object: load_model(model, method, tokenizer=...).")
    if isinstance(model, str) and model == "demo":
        from ..demo import load_demo_model

        model, tokenizer = load_demo_model()
    elif isinstance(model, Path | str):
        model = demo_folder(str(model))
    where = next(model.parameters()).device if isinstance(model, nn.Module) else None
    try:
        attribution_model = inseq.load_model(model, method, tokenizer=tokenizer, device=device, **kwargs)
    except BaseException:
        if where is not None:  # Inseq moves a model object to its device before the method can refuse it
            model.to(where)
        raise
    if dtype is not None:  # converted once Inseq and the method took it: a refused call leaves it as it was
        attribution_model.model.to(dtype)
    return attribution_model


def _load_front_end_model(name: str, found: ModelKind, tokenizer, processor):
    """An encoder-only or speech model saved under ``name``, as the class it was saved as (its head), with its
    tokenizer or processor when not given."""
    import transformers

    from ..specs.encoder_heads import TASK_ALIASES, TASK_SUFFIXES
    from .speech import load_processor

    architecture = ((found.config.architectures if found.config is not None else None) or [""])[0]
    if found.is_speech:
        processor = processor or load_processor(name)
        loader = getattr(transformers, architecture, None)
    elif found.is_vision:
        processor = processor or transformers.AutoImageProcessor.from_pretrained(name)
        loader = getattr(transformers, architecture, None)
    else:
        tokenizer = tokenizer or transformers.AutoTokenizer.from_pretrained(name)
        suffixes = (*TASK_SUFFIXES.values(), *TASK_ALIASES)
        loader = getattr(transformers, architecture, None) if architecture.endswith(suffixes) else None
    return (loader or transformers.AutoModel).from_pretrained(name), tokenizer, processor


def _is_inseq_model(model) -> bool:
    import sys

    inseq_models = sys.modules.get("inseq.models")  # an Inseq model exists only once Inseq is imported
    return inseq_models is not None and isinstance(model, inseq_models.AttributionModel)


def _front_end_kind(model) -> str:
    """The kind of one of this package's front ends."""
    from .speech import SpeechAttributionModel
    from .vision import VisionAttributionModel

    if isinstance(model, SpeechAttributionModel):
        return SPEECH
    return VISION if isinstance(model, VisionAttributionModel) else ENCODER


__all__ = [
    "ENCODER",
    "GENERATION",
    "SPEECH",
    "SPEECH_MODEL_TYPES",
    "VISION",
    "VISION_MODEL_TYPES",
    "ModelKind",
    "as_front_end",
    "identify",
    "is_front_end",
    "kind_of_config",
    "load_model",
    "read_config",
]
