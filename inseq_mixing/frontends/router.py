"""The one place that decides what kind a model is, and the one ``load_model`` every entry point calls.

The kinds are records (:mod:`.kinds`), each with its front end:

- ``"generation"``: encoder–decoders and decoder-only models (``...ForConditionalGeneration``, ``...ForCausalLM``,
  ``...LMHeadModel``, ``"demo"``, the embedded demo model, and ``"demo-retrieval"``, the retrieval demo model): Inseq's
  own ``AttributionModel`` with this package's method classes (:mod:`.inseq_adapter`);
- ``"encoder"``: encoder-only models of a supported family (masked LMs, classifiers, token classifiers, bare encoders):
  :class:`~.encoders.EncoderAttributionModel`;
- ``"speech"``: Whisper, wav2vec 2.0 and HuBERT (with CTC heads or bare): :class:`~.speech.SpeechAttributionModel`;
- ``"vision"``: ViT, DeiT, DINOv2, BEiT, Data2Vec-vision, CLIP's and SigLIP's image towers (image classifiers, bare
  encoders, CLIP's image–text similarity): :class:`~.vision.VisionAttributionModel`;
- ``"vision-language"``: the vision–language decoders (LLaVA, Qwen2-VL, ...: the spec files naming the kind), over
  images and prompts: :class:`~.vlm.VisionLanguageAttributionModel`.

:func:`identify` reads a name's or folder's config once and says its kind; :func:`load_model` takes what
:func:`identify` found (or finds it) and builds the kind's front end. The dataset runner, ``evaluate``, ``compare``,
the views and the CLI call these two and read the kind's record; they never test a model's kind themselves. A new
front end adds its kind as one record (:func:`.kinds.register_kind`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .kinds import ENCODER, GENERATION, KINDS, SPEECH, VISION, VISION_LANGUAGE, Kind, kind_of, resolve


@dataclass(frozen=True)
class ModelKind:
    """What :func:`identify` found: the kind, the config's ``model_type``, and the config it read (None for the
    demo model, or for a name whose config could not be read: its loader then says why)."""

    kind: str
    model_type: str | None = None
    config: Any = None

    @property
    def record(self) -> Kind:
        """The kind's record (:class:`.kinds.Kind`): what the layers above read instead of asking the kind."""
        return KINDS[self.kind]

    @property
    def run_columns(self) -> tuple[str, str]:
        """A dataset run's default source and target columns: ``source`` / ``target``; speech models ``audio`` and
        ``transcript`` (Whisper) or ``frames`` (CTC and bare encoders); vision models ``image`` and ``label`` (CLIP:
        the text); vision-language models ``prompt`` and ``answer`` (their images: :attr:`reads_images`)."""
        return self.record.columns(self.model_type)

    @property
    def reads_words(self) -> bool:
        """Whether a dataset run's rows may give word intervals (speech models' audio words)."""
        return self.record.reads_words

    @property
    def reads_images(self) -> bool:
        """Whether a dataset run's rows give image files (vision-language models)."""
        return self.record.reads_images


def kind_of_config(config, class_name: str | None = None) -> str:
    """The kind of a model from its config (and, for a model object, its class name): the first record that claims
    it; a model no other kind claims goes to the encoder front end, which names what it does not support."""
    return kind_of(config, class_name).name


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
    """Why ``inseq.load_model`` cannot take ``model`` and what to call instead (a speech or vision model, or an
    encoder-only one: a family with a masked-LM head in transformers, not a bare decoder), or None for a model Inseq
    takes or whose kind cannot be told (its config cannot be read)."""
    try:
        found = identify(model)
    except Exception:  # noqa: BLE001  (a model this cannot tell the kind of is Inseq's to refuse or load)
        return None
    record = found.record
    if record.inseq_loads(found.model_type):
        return None
    return (
        f"inseq.load_model loads generation models, and this is {record.label} model ({found.model_type}): use "
        f"inseq_mixing.load_model(model, {method or 'METHOD'!r}, {record.companion}=...), whose .attribute() gives "
        "Inseq output."
    )


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
            processor; vision-language models: the processor (image processor and tokenizer) (default: loaded from
            the model's name or folder).
        device: e.g. ``"cpu"`` or ``"cuda"``.
        dtype: e.g. ``torch.bfloat16``.
        found: What :func:`identify` found for ``model``, when the caller asked already (its config is not read
            again).
        kwargs: Passed to ``inseq.load_model`` for generation models.
    """
    from ..specs import MIXING_OUTSIDE_ATTENTION, get_spec
    from .common import FrontEndModel

    if isinstance(model, FrontEndModel):
        return model if model.method == method else model.for_method(method)
    if _is_inseq_model(model):
        if device is not None:
            model.device = device
        model.attribution_method = model.get_attribution_method(method)
        return model
    found = found or identify(model)
    record = found.record
    if record.front_end is None:
        return _generation_model(model, method, tokenizer, device, dtype, **kwargs)
    if isinstance(model, str | Path):
        model, tokenizer, processor = resolve(record.load)(str(model), found.config, tokenizer, processor)
    if found.model_type in MIXING_OUTSIDE_ATTENTION:
        get_spec(model)  # refused, with what mixes its tokens outside attention, before asking for anything else
    companion = {"tokenizer": tokenizer, "processor": processor}[record.companion]
    if companion is None:
        raise ValueError(
            f"Pass the {record.companion} of this {record.name} model: load_model(model, method, "
            f"{record.companion}=...)."
        )
    front = record.front_end_class()(model, companion, method)
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


def run_front_end(model):
    """The front end a dataset run drives through its hooks: one of this package's front ends as it is, an Inseq
    model (the generation kind) as a :class:`~.generation.GenerationFrontEnd`."""
    from .common import FrontEndModel
    from .generation import GenerationFrontEnd

    return model if isinstance(model, FrontEndModel) else GenerationFrontEnd(model)


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


def _is_inseq_model(model) -> bool:
    import sys

    inseq_models = sys.modules.get("inseq.models")  # an Inseq model exists only once Inseq is imported
    return inseq_models is not None and isinstance(model, inseq_models.AttributionModel)


def _front_end_kind(model) -> str:
    """The kind of one of this package's front ends: the kind whose front-end class is nearest in its class's
    ancestry (a subclass of another kind's front end is of its own kind)."""
    ancestry = type(model).__mro__
    classes = {record.name: record.front_end_class() for record in KINDS.values() if record.front_end is not None}
    found = [(ancestry.index(cls), name) for name, cls in classes.items() if cls in ancestry]
    return min(found)[1]


__all__ = [
    "ENCODER",
    "GENERATION",
    "SPEECH",
    "VISION",
    "VISION_LANGUAGE",
    "Kind",
    "ModelKind",
    "as_front_end",
    "identify",
    "is_front_end",
    "kind_of_config",
    "load_model",
    "read_config",
    "run_front_end",
]
