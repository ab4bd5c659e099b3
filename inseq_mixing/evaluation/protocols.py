"""The evaluation protocols as a registry: ``(kind, protocol) →`` the function that runs it, the columns its rows
have and the settings it reads beyond the shared ones; ``kind →`` its method comparison (:func:`~.compare.compare`)
and its faithfulness on a stored run (:func:`~.stored.evaluate_run`).

``evaluate``, ``evaluate_run``, ``compare`` and the command line look a model's kind up here and run what they find;
none of them asks which kind a model is. The functions are named ``"module:function"`` and imported when run (the
kinds' protocol modules import torch, and the shared scoring only, never each other). A new kind registers its
protocols with :func:`register_protocol` (and :func:`register_comparison`, :func:`register_stored`).

Every protocol function is called as ``run(model, methods, data, protocol, found, settings)``: the model as the user
gave it (a name, a model object or a front end), the method names, the rows, the protocol's name, what
:func:`~inseq_mixing.frontends.identify` found, and one :class:`Settings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..frontends.kinds import ENCODER, GENERATION, KINDS, SPEECH, VISION, VISION_LANGUAGE, resolve
from .items import DEFAULT_COLUMNS, EvaluationInputError


@dataclass(frozen=True)
class Settings:
    """What ``evaluate`` was given besides the model, methods, data and protocol (see its arguments)."""

    tokenizer: Any = None
    processor: Any = None
    batch_size: int = 16
    device: str | None = None
    method_kwargs: dict = field(default_factory=dict)
    draws: int = 1000
    seed: int = 0
    examples: int = 2
    random_draws: int = 3
    show_progress: bool = False
    target_tokens: str = "first"
    random_baseline: bool = False
    replacement: str = "mean"
    steps: int = 10
    hops: int = 0
    separator: str = "\n\n"
    columns: dict = field(default_factory=dict)


#: Options that choose a map's layout: a protocol that reads maps as their papers do leaves the layout to a caller who
#: gives one of them.
LAYOUT_OPTIONS = ("per_layer", "rollout", "per_head")

#: The protocols that read maps as their papers do (the cue's share per layer, in both Value Zeroing papers).
PAPER_LAYOUT_PROTOCOLS = ("cue",)


def paper_options(method: str, options: dict, protocol: str) -> dict:
    """``options`` for ``method`` in ``protocol``: in one of :data:`PAPER_LAYOUT_PROTOCOLS`, the method's declared
    ``paper_layout`` (value zeroing and the attention norm: per layer, not their default layers' mean) added, unless
    ``options`` choose a layout themselves or the method has none; in the others, ``options`` as given."""
    from ..declarations import DECLARATIONS

    declaration = DECLARATIONS.get(method)
    chosen = any(name in options for name in LAYOUT_OPTIONS)
    if protocol not in PAPER_LAYOUT_PROTOCOLS or declaration is None or chosen:
        return dict(options)
    return {**declaration.paper_layout, **options}


#: Settings a protocol reads only where it says so (:attr:`Protocol.options`), with the value that means "not asked".
OPTIONAL = {"random_baseline": False, "hops": 0, "replacement": "mean", "steps": 10, "separator": "\n\n"}


@dataclass(frozen=True)
class Protocol:
    """One protocol of one kind of model.

    Attributes:
        kind: The kind's name (:mod:`inseq_mixing.frontends.kinds`).
        name: The protocol's name (``"cue"``, ``"faithfulness"``, ...).
        run: ``"module:function"`` running it (see the module docstring).
        columns: The column roles of its rows (the command line's ``--ROLE-column`` flags it reads).
        options: The settings of :data:`OPTIONAL` it reads; another one given is refused before any work.
    """

    kind: str
    name: str
    run: str
    columns: tuple[str, ...] = ()
    options: tuple[str, ...] = ()

    def __call__(self, model, methods: list[str], data, found, settings: Settings):
        return resolve(self.run)(model, methods, data, self.name, found, settings)


PROTOCOLS: dict[tuple[str, str], Protocol] = {}
COMPARISONS: dict[str, str] = {}
STORED: dict[str, str] = {}


def register_protocol(protocol: Protocol) -> Protocol:
    """Add (or replace) a kind's protocol."""
    PROTOCOLS[(protocol.kind, protocol.name)] = protocol
    return protocol


def register_comparison(kind: str, run: str) -> None:
    """A kind's method comparison: ``"module:function"`` called as ``run(model, methods, inputs, targets, found,
    settings)`` with a :class:`ComparisonSettings`."""
    COMPARISONS[kind] = run


def register_stored(kind: str, run: str) -> None:
    """A kind's faithfulness on a stored run: ``"module:function"`` called as ``run(front, run, ids, sequences,
    random_draws, seed, show_progress)``, returning the scored tokens and, where the report draws them, each
    example's image (else None)."""
    STORED[kind] = run


def protocol_names() -> list[str]:
    """Every protocol some kind takes."""
    return sorted({name for _, name in PROTOCOLS})


def protocols_of(kind: str) -> list[str]:
    """The protocols a kind takes."""
    return [name for (owner, name) in PROTOCOLS if owner == kind]


def lookup(found, protocol: str) -> Protocol:
    """The protocol ``protocol`` of the kind ``found`` (what ``identify`` found), or ``EvaluationInputError`` naming
    the protocols this model takes and the kinds that take ``protocol``."""
    entry = PROTOCOLS.get((found.kind, protocol))
    if entry is not None:
        return entry
    record = KINDS[found.kind]
    takes = sorted(protocols_of(found.kind))
    owners = [KINDS[kind].noun for (kind, name) in PROTOCOLS if name == protocol]
    where = f"for {', '.join(owners)} models" if owners else "unknown"
    raise EvaluationInputError(
        f"The {protocol!r} protocol is {where}; this is {record.label} model ({found.model_type}), evaluated with "
        f"the protocols {takes}."
    )


def check_settings(entry: Protocol, settings: Settings) -> None:
    """Refuse a setting of :data:`OPTIONAL` given to a protocol that does not read it (``ValueError``)."""
    for name, unset in OPTIONAL.items():
        if getattr(settings, name) != unset and name not in entry.options:
            takers = sorted(f"{KINDS[p.kind].noun} {p.name}" for p in PROTOCOLS.values()
                            if name in p.options)  # fmt: skip
            raise ValueError(
                f"{name} is not read by the {entry.name} protocol of this model; it is for: {', '.join(takers)}."
            )


@dataclass(frozen=True)
class ComparisonSettings:
    """What ``compare`` was given besides the model, methods, inputs and targets (see its arguments)."""

    tokenizer: Any = None
    processor: Any = None
    replacement_token: str | None = None
    fractions: tuple = ()
    random_draws: int = 3
    method_kwargs: dict = field(default_factory=dict)
    show_progress: bool = False
    max_new_tokens: int | None = None
    attributed_fn: str | None = "logit"


def comparison(found) -> Any:
    """The method comparison of a kind, or ``ValueError`` naming the kinds that have one."""
    if found.kind not in COMPARISONS:
        kinds = ", ".join(KINDS[kind].noun for kind in COMPARISONS)
        raise ValueError(f"compare takes {kinds} models; this is {KINDS[found.kind].label} model.")
    return resolve(COMPARISONS[found.kind])


def stored(found) -> Any:
    """The stored-run faithfulness of a kind."""
    return resolve(STORED[found.kind])


TEXT_COLUMNS = tuple(DEFAULT_COLUMNS)
SPEECH_COLUMNS = (*TEXT_COLUMNS, "audio", "words", "transcript")
IMAGE_COLUMNS = ("image", "label", "box", "patches")
IMAGE_OPTIONS = ("random_baseline", "replacement", "steps")

for _name in ("evidence", "cue", "alignment", "faithfulness"):
    register_protocol(Protocol(GENERATION, _name, "inseq_mixing.evaluation.generation:evaluate_generation",
                               TEXT_COLUMNS))  # fmt: skip
register_protocol(Protocol(GENERATION, "context", "inseq_mixing.evaluation.context:run_context",
                           ("passages", "question", "answer", "gold"), ("hops", "separator")))  # fmt: skip
for _name in ("evidence", "cue", "faithfulness"):
    register_protocol(Protocol(ENCODER, _name, "inseq_mixing.evaluation.encoders:evaluate_encoder", TEXT_COLUMNS))
register_protocol(Protocol(SPEECH, "cue", "inseq_mixing.evaluation.speech:run_speech", SPEECH_COLUMNS,
                           ("random_baseline",)))  # fmt: skip
register_protocol(Protocol(SPEECH, "blankout", "inseq_mixing.evaluation.speech:run_speech", SPEECH_COLUMNS))
register_protocol(Protocol(SPEECH, "faithfulness",
                           "inseq_mixing.evaluation.speech_faithfulness:run_speech_faithfulness",
                           SPEECH_COLUMNS))  # fmt: skip
for _name in ("faithfulness", "pointing"):
    register_protocol(Protocol(VISION, _name, "inseq_mixing.evaluation.vision:run_vision", IMAGE_COLUMNS,
                               IMAGE_OPTIONS))  # fmt: skip

register_protocol(Protocol(VISION_LANGUAGE, "pointing", "inseq_mixing.evaluation.vlm:run_vlm",
                           ("images", "prompt", "answer", "box")))  # fmt: skip
register_protocol(Protocol(VISION_LANGUAGE, "faithfulness", "inseq_mixing.evaluation.vlm:run_vlm",
                           ("images", "prompt", "answer"), ("steps",)))  # fmt: skip

register_comparison(GENERATION, "inseq_mixing.evaluation.generation:compare_generation")
register_comparison(ENCODER, "inseq_mixing.evaluation.encoders:compare_encoder")
register_comparison(VISION, "inseq_mixing.evaluation.vision:compare_vision")
register_comparison(VISION_LANGUAGE, "inseq_mixing.evaluation.vlm:compare_vlm")
register_stored(GENERATION, "inseq_mixing.evaluation.generation:stored_faithfulness")
register_stored(ENCODER, "inseq_mixing.evaluation.encoders:stored_faithfulness")
register_stored(SPEECH, "inseq_mixing.evaluation.speech_faithfulness:stored_faithfulness")
register_stored(VISION, "inseq_mixing.evaluation.vision:stored_faithfulness")
