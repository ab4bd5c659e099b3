"""Kinds of models as records: what a kind is called, which models it claims, its front end and companion (tokenizer
or processor), a dataset run's columns, what the explorer and the command line do with it.

:func:`~.router.identify` asks the records in order which one claims a config (the first that does; the encoder kind
claims whatever is left), :func:`~.router.load_model` builds the record's front end, and every layer above the front
ends reads what it needs from the record (:attr:`~.router.ModelKind.record`) or looks up a table keyed by the kind's
name (the evaluation protocols, :mod:`inseq_mixing.evaluation.protocols`): nothing outside this package's
``frontends`` asks a model which kind it is. A new kind is one record (:func:`register_kind`), its front-end module
and its spec files (each naming the kind in ``KIND``); the tests register one from outside the package.

What a record refers to in modules that import torch (its front-end class, its loaders, the explorer's media) is
named as ``"module:attribute"`` and imported on first use, so that telling a model's kind stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

GENERATION, ENCODER, SPEECH, VISION = "generation", "encoder", "speech", "vision"
VISION_LANGUAGE = "vision-language"

#: Class-name endings of generation models (the head a config was saved with, or a model object's class).
GENERATION_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


@dataclass(frozen=True)
class Kind:
    """One kind of model.

    Attributes:
        name: The kind's name (``"generation"``, ``"encoder"``, ``"speech"``, ``"vision"``): the key of every table
            that holds something per kind (the evaluation protocols).
        label: How messages name such a model (``"a speech"`` model).
        companion: What turns its inputs into ids or features: ``"tokenizer"`` or ``"processor"``.
        front_end: ``"module:Class"`` of its front end, built as ``Class(model, companion, method)``; None: Inseq's
            own ``AttributionModel`` (generation models).
        claims: Whether a config (and, for a model object or a saved head, its class name) is of this kind; None:
            the config's ``model_type`` is one of the spec files' naming this kind (``KIND``).
        fallback: Claims what no other kind claims (asked last).
        columns: A dataset run's default source and target columns, by the config's ``model_type``.
        reads_words: Whether a dataset run's rows may give word intervals (audio words).
        reads_images: Whether a dataset run's rows give image files (a column of paths, ``images`` by default).
        inseq_loads: Whether ``inseq.load_model`` takes such a model (by ``model_type``); when it does not, it says
            to call this package's ``load_model`` instead.
        load: ``"module:function"`` loading a saved model of this kind, ``(name, config, tokenizer, processor) →
            (model, tokenizer, processor)``; None: Inseq loads it.
        explorer_options: Keyword arguments the explorer adds to every ``attribute`` call.
        explorer_media: ``"module:function"``, ``(front end, inputs) → keyword arguments of explore()`` (the images
            or the audio drawn beside the scores); None: nothing.
        commands: The command-line commands that take such a model, for the hint ``inseq-mixing attribute`` (Inseq's
            command for generation models) gives when it is handed one; None: ``attribute`` takes it.
        folder_hint: What the command line adds when a local folder of this kind cannot be loaded.
        check_loaded: ``"module:function"`` the command line calls on a front end it loaded from a name (a
            ``ValueError`` becomes its one-line error); None: nothing.
    """

    name: str
    label: str
    companion: str
    front_end: str | None = None
    claims: Callable[[Any, str | None], bool] | None = None
    fallback: bool = False
    columns: Callable[[str | None], tuple[str, str]] = lambda model_type: ("source", "target")
    reads_words: bool = False
    reads_images: bool = False
    inseq_loads: Callable[[str | None], bool] = lambda model_type: False
    load: str | None = None
    explorer_options: Mapping[str, Any] = field(default_factory=dict)
    explorer_media: str | None = None
    commands: str | None = None
    folder_hint: str = ""
    check_loaded: str | None = None

    def model_types(self) -> tuple[str, ...]:
        """The ``config.model_type`` values of the spec files naming this kind (``KIND``)."""
        from ..specs import SPEC_MODULES

        return tuple(sorted(t for module in SPEC_MODULES if getattr(module, "KIND", None) == self.name
                            for t in module.MODEL_TYPES))  # fmt: skip

    def claims_config(self, config, class_name: str | None) -> bool:
        """Whether a config (and a class name, when there is one) is of this kind."""
        if self.claims is not None:
            return self.claims(config, class_name)
        return getattr(config, "model_type", None) in self.model_types()

    @property
    def noun(self) -> str:
        """The kind as a noun phrase without its article (``"speech"``, ``"encoder-only"``)."""
        return self.label.split(" ", 1)[1]

    def front_end_class(self) -> type | None:
        """The front-end class (imported on first use), or None for Inseq's model."""
        return None if self.front_end is None else resolve(self.front_end)


def resolve(path: str) -> Any:
    """The object a ``"module:attribute"`` path names."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


#: Every kind, by name, in the order they are asked (fallbacks last, whatever the order of registration).
KINDS: dict[str, Kind] = {}


def register_kind(kind: Kind) -> Kind:
    """Add a kind (or replace the one of the same name); it is asked before the fallback kind."""
    KINDS[kind.name] = kind
    ordered = sorted(KINDS.values(), key=lambda record: record.fallback)  # stable: registration order otherwise
    KINDS.clear()
    KINDS.update((record.name, record) for record in ordered)
    return kind


def unregister_kind(name: str) -> None:
    """Take a kind out (a test's kind, after the test)."""
    KINDS.pop(name, None)


def kind_of(config, class_name: str | None = None) -> Kind:
    """The first kind that claims ``config`` (the fallback claims what is left)."""
    return next(record for record in KINDS.values() if record.claims_config(config, class_name))


def _is_generation(config, class_name: str | None) -> bool:
    names = [class_name] if class_name is not None else list(getattr(config, "architectures", None) or [])
    return bool(getattr(config, "is_encoder_decoder", False)) or any(name.endswith(GENERATION_SUFFIXES)
                                                                    for name in names)  # fmt: skip


def _inseq_loads_encoder(model_type: str | None) -> bool:
    """Whether Inseq takes a model the encoder kind claimed: not an encoder-only family (transformers has a masked-LM
    head for it), but a bare decoder (``LlamaModel``), which Inseq loads (or says why not)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


register_kind(Kind(
    SPEECH, "a speech", "processor", front_end="inseq_mixing.frontends.speech:SpeechAttributionModel",
    columns=lambda model_type: ("audio", "transcript" if model_type == "whisper" else "frames"), reads_words=True,
    load="inseq_mixing.frontends.speech:load_saved", explorer_media="inseq_mixing.frontends.speech:explorer_media",
    commands="`inseq-mixing attribute-dataset` (rows of audio files) or `evaluate`",
))  # fmt: skip
register_kind(Kind(
    VISION, "a vision", "processor", front_end="inseq_mixing.frontends.vision:VisionAttributionModel",
    columns=lambda model_type: ("image", "label"), load="inseq_mixing.frontends.vision:load_saved",
    explorer_media="inseq_mixing.frontends.vision:explorer_media",
    commands="`inseq-mixing compare` (an image file), `attribute-dataset` or `evaluate`",
))  # fmt: skip
register_kind(Kind(  # before the generation kind, which claims every ...ForConditionalGeneration
    VISION_LANGUAGE, "a vision-language", "processor",
    front_end="inseq_mixing.frontends.vlm:VisionLanguageAttributionModel",
    columns=lambda model_type: ("prompt", "answer"), reads_images=True, load="inseq_mixing.frontends.vlm:load_saved",
    commands="the Python front end (images and prompts)",
))  # fmt: skip
register_kind(Kind(
    GENERATION, "a generation", "tokenizer", claims=_is_generation, inseq_loads=lambda model_type: True,
    explorer_options={"attribute_target": True},
    folder_hint=" (a local folder needs the tokenizer files next to the weights)",
    check_loaded="inseq_mixing.frontends.inseq_adapter.base:check_loaded",
))  # fmt: skip
register_kind(Kind(
    ENCODER, "an encoder-only", "tokenizer", front_end="inseq_mixing.frontends.encoders:EncoderAttributionModel",
    claims=lambda config, class_name: True, fallback=True, inseq_loads=_inseq_loads_encoder,
    load="inseq_mixing.frontends.encoders:load_saved",
    commands="`inseq-mixing compare`, `attribute-dataset` or `evaluate`",
))  # fmt: skip
