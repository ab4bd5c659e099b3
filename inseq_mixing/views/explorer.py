"""The explorer: one self-contained HTML page (no network assets, no script library) to look at outputs layer by layer.

``explore(outputs)`` (and ``out.explore()`` on any output, :mod:`inseq_mixing.frontends.patches`) reads outputs of
one or more methods on the same inputs, of any front end (generation models through Inseq, encoder-only, speech,
vision, spans), and writes a page with, per input:

- each method's map of input units (rows) × explained entries (columns), side by side, at the layer a slider picks
  (outputs with a layer axis; the others show their one map on every layer), and per head or the residual where the
  output has (layer, head) slots (a selector; "sum" adds the layer's slots);
- click an explained entry (a column) to list what it mixes from, per method, with the values; click an input unit (a
  row) to list what it mixes into;
- the contribution graph (Ferrando & Voita 2024) of the clicked entry, where the output was made with
  ``contribution_graphs=True``, drawn layer by layer (edge width: importance);
- images (``images=``): the overlays first, one per method with a colour bar spanning the patches, a patch clickable
  (what it mixes into), the graph's input row drawn as the patch grid; audio (``audio=``): the waveform with its units
  shaded;
- long texts (more than :data:`LONG_UNITS` units): rows grouped (:func:`row_groups`), a group opened into its tokens
  by a click; lists of many entries drawn as heat strips.

The page is made from :data:`TEMPLATE` (``explorer_template.html`` beside this module): its one script reads the
page's JSON data. Values are written with 6 significant digits, shown with 4, and with 3 on hover.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from pathlib import Path

import numpy as np

from .colours import LOWER, RAISE, scale_name
from .pages import fill_template, script_json

TEMPLATE = Path(__file__).with_name("explorer_template.html")

_AXIS = re.compile(r"^(?:(?P<stack>self-attention|cross-attention|decoder|encoder) )?layer (?P<layer>\d+)"
                   r"(?: (?P<slot>head \d+|residual))?$")  # fmt: skip
#: The slot of a whole layer: the only one of an output without heads, the sum of the slots of one with heads.
ALL = "all (sum of the slots)"
_TIMED = re.compile(r"(\d+(?:\.\d+)?)-\d+(?:\.\d+)?s\]?$")  # a unit's start: "0.50-0.98s", "[sil 0.5-0.9s]"


def explore(outputs, path=None, *, images=None, audio=None, sampling_rate: int = 16_000, title: str | None = None):
    """Write the explorer page of ``outputs`` (see the module docstring).

    Args:
        outputs: One output (``inseq.FeatureAttributionOutput``), a list of outputs of different methods on the same
            inputs, or a dictionary ``{name: output}`` (names default to each output's method).
        path: Where to write the page (None: only return it).
        images: The images a vision output explains, one per sequence (paths, PIL images, arrays or tensors); a
            vision-language output: each prompt's images (a list; each drawn cut to what its grid covers, its tokens
            on it, one colour scale over every image of the prompt).
        audio: The waveforms a speech output explains, one per sequence (1-D arrays at ``sampling_rate``).
        sampling_rate: The waveforms' sampling rate.
        title: The page's title.

    Returns:
        The page's HTML.

    Raises:
        ValueError: Outputs of different inputs (their sequence counts or explained entries differ), or a number of
            images or waveforms that is not one per sequence.
    """
    named = _named_outputs(outputs)
    first = next(iter(named.values()))
    count = len(first.sequence_attributions)
    for name, output in named.items():
        if len(output.sequence_attributions) != count:
            raise ValueError(f"Output {name!r} has {len(output.sequence_attributions)} sequence(s), the first has "
                             f"{count}: give outputs of the same inputs.")  # fmt: skip
    media = [[] for _ in range(count)]  # per sequence: its images (a vision-language prompt's several) or waveform
    if images is not None:  # a vision-language output: each prompt's images, cut to what their grids cover
        boxes = (first.info or {}).get("image_boxes")
        for index, pictures in enumerate(_one_per_sequence(images, count, "image")):
            pictures = list(pictures) if isinstance(pictures, list | tuple) else [pictures]
            media[index] = [_image_media(picture, None if boxes is None else boxes[index][number])
                            for number, picture in enumerate(pictures)]  # fmt: skip
    elif audio is not None:
        media = [[_audio_media(wave, sampling_rate)] for wave in _one_per_sequence(audio, count, "waveform")]
    sequences = []
    for index in range(count):
        methods = [_method_data(name, output, index) for name, output in named.items()]
        units, columns = methods[0].pop("units"), methods[0].pop("columns")
        for name, method in zip(list(named)[1:], methods[1:], strict=True):
            other, other_units = method.pop("columns"), method.pop("units")
            if len(other) != len(columns) or len(other_units) != len(units):
                raise ValueError(f"Output {name!r} explains {len(other)} entries over {len(other_units)} units in "
                                 f"sequence {index}, the first {len(columns)} over {len(units)}: give outputs of the "
                                 "same inputs.")  # fmt: skip
            # a map method names an explained token ([CLS]) where a logit method names its label: keep both
            columns = [c if c == o else f"{c} / {o}" for c, o in zip(columns, other, strict=True)]
        graphs = _graphs(named.values(), index, units)
        seconds = (first.info or {}).get("unit_seconds")
        seconds = seconds[index] if isinstance(seconds, list) and index < len(seconds) else None
        placed = [_place_units(item, units, seconds, number + 1) for number, item in enumerate(media[index])]
        image = bool(placed) and placed[0]["kind"] == "image"
        sequence = {"name": _sequence_name(first, index), "units": units, "columns": columns, "methods": methods,
                    "graphs": graphs, "media": placed[0] if placed else None, "images": placed if image else [],
                    "groups": None if image else row_groups(units)}  # fmt: skip
        sequences.append(sequence)
    data = {"title": title or "Context mixing explorer", "sequences": sequences,
            "note": next((o.info.get("contribution_graphs_note") for o in named.values()
                          if (o.info or {}).get("contribution_graphs_note")), None),
            "colours": {"raise": list(RAISE), "lower": list(LOWER), "signed": scale_name(True),
                        "map": scale_name(False)}}  # fmt: skip
    page = fill_template(TEMPLATE.read_text(encoding="utf-8"),
                         {"__TITLE__": html.escape(data["title"]), "__DATA__": script_json(data)})  # fmt: skip
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(page, encoding="utf-8")
    return page


#: The methods the explorer compares by default, with the options that give them a layer axis (per-layer maps,
#: (layer, head) slots): value zeroing per layer, ALTI per layer and head, and ALTI-logit's logit scores.
DEFAULT_METHODS = {"alti": {"per_head": True}, "value_zeroing": {"per_layer": True}, "alti_logit": {}}


def explore_model(
    model,
    inputs,
    targets=None,
    path=None,
    *,
    methods: dict[str, dict] | list[str] | None = None,
    contribution_graphs: bool | dict = True,
    title: str | None = None,
    **load_kwargs,
):
    """Run several methods on the same inputs and write their explorer page (what ``inseq-mixing explore`` does).

    Args:
        model: Anything :func:`inseq_mixing.load_model` takes: a name or folder, ``"demo"``, a model object (with
            ``tokenizer=`` or ``processor=`` in ``load_kwargs``), an Inseq model or a front end.
        inputs: What the model's ``attribute`` takes: a text or prompt, an image, a waveform or audio file path (or
            a list of them).
        targets: The target texts, labels or transcripts (None: the model's own).
        path: Where to write the page (None: only return it).
        methods: Method names, or ``{name: options}`` (default :data:`DEFAULT_METHODS`).
        contribution_graphs: The routes of every explained entry (drawn for the clicked one), computed with the
            first method: ``True``, ``False`` or ``{"threshold": τ, "heads": bool}``.
        title: The page's title.
        load_kwargs: Passed to :func:`inseq_mixing.load_model` (``tokenizer=``, ``processor=``, ``device=``).

    Returns:
        The page's HTML.
    """
    from ..frontends import identify, load_model
    from ..frontends.kinds import resolve

    methods = dict(DEFAULT_METHODS) if methods is None else methods
    methods = {name: {} for name in methods} if isinstance(methods, list | tuple) else dict(methods)
    if not methods:
        raise ValueError("Give at least one method to explore.")
    found = identify(model)
    record = found.record
    first = load_model(model, next(iter(methods)), found=found, **load_kwargs)
    outputs = {}
    for index, (method, options) in enumerate(methods.items()):
        front = first if index == 0 else load_model(first, method)
        extra = {"contribution_graphs": contribution_graphs} if index == 0 and contribution_graphs else {}
        args = (inputs,) if targets is None else (inputs, targets)
        outputs[method] = front.attribute(*args, show_progress=False, **options, **record.explorer_options, **extra)
    media = resolve(record.explorer_media)(first, inputs) if record.explorer_media is not None else {}
    return explore(outputs, path, title=title, **media)


def contribution_graphs(output, sequence: int = 0) -> list:
    """The routes an output made with ``contribution_graphs=True`` holds for one sequence, as
    :class:`~inseq_mixing.methods.graph.ContributionGraph` objects (one per explained entry, in order), their nodes
    labelled with the output's tokens where the stacks' lengths match.

    Raises:
        ValueError: The output holds no graphs (made without ``contribution_graphs=True``), or no such sequence.
    """
    from ..methods.graph import ContributionGraph

    if "contribution_graphs" not in (output.info or {}):
        note = (output.info or {}).get("contribution_graphs_note")
        raise ValueError(note or "This output holds no contribution graphs: make it with model.attribute(..., "
                         "contribution_graphs=True).")  # fmt: skip
    count = len(output.sequence_attributions)
    if not 0 <= sequence < count:
        raise ValueError(f"sequence={sequence}: the output has {count} sequence(s).")
    units = _units(output.sequence_attributions[sequence])
    return [ContributionGraph.from_dict(graph) for graph in _graphs([output], sequence, units)]


#: Above this many input units, a text's rows start as groups (passages, or runs of sentences) to drill into, and the
#: lists of what an entry mixes from are heat strips (values on hover) rather than chips.
LONG_UNITS = 64
#: About how many groups the rows of a long text start as, where the text has no passage breaks.
GROUPS = 20
#: A newline as tokenizers write it (byte-level BPE: Ċ; SentencePiece: <0x0A>), and a token that ends a sentence.
_NEWLINE = re.compile(r"\n|Ċ|<0x0A>")
_SENTENCE_END = re.compile(r"^[\s▁Ġ]*[.!?。]+[\s▁Ġ]*$")


def row_groups(units: list[dict]) -> list[dict] | None:
    """The groups of units a long text's rows start as (None for :data:`LONG_UNITS` units or fewer): its passages
    where newlines cut it into 2–200 of them, else about :data:`GROUPS` runs of whole sentences (each cut at the
    sentence end nearest to a multiple of ``units / GROUPS``, or there where no sentence ends within half of that);
    never across the source and target units. Each group: its ``label`` (first words and unit range), ``start`` and
    ``end`` (unit indices, end excluded)."""
    if len(units) <= LONG_UNITS:
        return None
    newline = [bool(_NEWLINE.search(unit["token"])) for unit in units]
    passages = 2 <= sum(newline) + 1 <= 200
    size = math.ceil(len(units) / GROUPS)
    cuts = {index for index in range(1, len(units)) if units[index]["group"] != units[index - 1]["group"]}
    if passages:
        cuts |= {index + 1 for index, cut in enumerate(newline) if cut}
    else:
        ends = [index + 1 for index, unit in enumerate(units) if _SENTENCE_END.match(unit["token"])]
        for mark in range(size, len(units), size):
            nearest = min(ends, key=lambda end: abs(end - mark), default=mark)
            cuts.add(nearest if abs(nearest - mark) <= size // 2 else mark)
    bounds = sorted({0, *cuts, len(units)})
    return [{"label": _group_label(units, start, end), "start": start, "end": end}
            for start, end in zip(bounds, bounds[1:], strict=False)]  # fmt: skip


def _group_label(units: list[dict], start: int, end: int) -> str:
    words = " ".join(unit["token"] for unit in units[start : min(end, start + 8)])
    words = " ".join(re.sub(r"[▁ĠĊ]", " ", words).split())
    words = words if len(words) <= 32 else words[:31] + "…"
    return f"{words} ({start}–{end - 1})"


def _named_outputs(outputs) -> dict:
    if isinstance(outputs, dict):
        named = dict(outputs)
    else:
        listed = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
        named = {}
        for output in listed:
            name = (output.info or {}).get("attribution_method") or f"output {len(named)}"
            while name in named:
                name += "'"
            named[name] = output
    if not named:
        raise ValueError("Give at least one output to explore.")
    return named


def _one_per_sequence(items, count: int, what: str) -> list:
    items = list(items) if isinstance(items, list | tuple) else [items]
    if len(items) != count:
        raise ValueError(f"The outputs explain {count} sequence(s), but {len(items)} {what}(s) were given: one each.")
    return items


def _sequence_name(output, index: int) -> str:
    info = output.info or {}
    for key in ("input_images", "input_texts", "input_audio"):
        names = info.get(key)
        if isinstance(names, list) and index < len(names):
            return str(names[index])[:120]
    return f"Sequence {index}"


def _rounded(values: np.ndarray) -> list:
    """Values with 6 significant digits, NaN (a future token) as None."""
    flat = [None if not math.isfinite(v) else float(f"{v:.6g}") for v in values.reshape(-1).tolist()]
    return np.array(flat, dtype=object).reshape(values.shape).tolist()


def _method_data(name: str, output, index: int) -> dict:
    """One method's units, columns and values ``[layer][slot][unit][column]`` for sequence ``index``."""
    sequence = output.sequence_attributions[index]
    blocks = [block for block in (sequence.source_attributions, sequence.target_attributions) if block is not None]
    units = _units(sequence)
    if not blocks:
        raise ValueError(f"Output {name!r}, sequence {index}, has no scores to explore.")
    scores = np.concatenate([block.detach().double().cpu().numpy() for block in blocks], axis=0)  # (U, C[, A])
    columns = [t.token for t in sequence.target[sequence.attr_pos_start : sequence.attr_pos_end]]
    if len(columns) != scores.shape[1]:
        columns = [f"entry {column}" for column in range(scores.shape[1])]
    axis = (output.info or {}).get("score_axis")
    layers, slots, grid = _layer_slots(scores, axis)
    finite = scores[np.isfinite(scores)]
    return {
        "name": name,
        "units": units,
        "columns": columns,
        "layers": layers,
        "slots": slots,
        "signed": bool(finite.size and finite.min() < 0),
        "values": _rounded(grid),
    }


def _units(sequence) -> list[dict]:
    """The input units of a sequence's scores, in the page's order: the source tokens (where the sequence has source
    scores), then the target tokens (where it has target scores)."""
    units = []
    if sequence.source_attributions is not None:
        units += [{"token": t.token, "group": "source"} for t in sequence.source]
    if sequence.target_attributions is not None:
        units += [{"token": t.token, "group": "target"} for t in sequence.target]
    return units


def _layer_slots(scores: np.ndarray, axis: list[str] | None) -> tuple[list[str], list[str], np.ndarray]:
    """The extra axis as (layer labels, slot labels, ``(layers, slots, U, C)``): per-layer outputs one slot per layer,
    (layer, head) outputs one slot per head and residual (encoder–decoders: self- and cross-attention's, named) after
    a first slot, :data:`ALL`, the sum of the layer's slots; outputs without an axis one layer."""
    if scores.ndim == 2:
        return ["all layers"], [ALL], scores[None, None]
    parsed = [_AXIS.match(label) for label in axis] if axis and len(axis) == scores.shape[-1] else []
    if not parsed or not all(parsed):
        labels = list(axis) if axis and len(axis) == scores.shape[-1] else [str(i) for i in range(scores.shape[-1])]
        return labels, [ALL], np.moveaxis(scores, -1, 0)[:, None]
    # each entry's layer and slot (a head or the residual, named with its attention stack in encoder–decoders)
    entries = [(int(match["layer"]), _slot_label(match)) for match in parsed]
    layers = sorted({layer for layer, _ in entries})
    slot_names = list(dict.fromkeys(slot for _, slot in entries if slot is not None))
    if not slot_names:
        grid = np.full((len(layers), 1, *scores.shape[:2]), np.nan)
        for position, (layer, _) in enumerate(entries):
            grid[layers.index(layer), 0] = scores[..., position]
        return [f"layer {layer}" for layer in layers], [ALL], grid
    grid = np.zeros((len(layers), len(slot_names) + 1, *scores.shape[:2]))
    for position, (layer, slot) in enumerate(entries):
        grid[layers.index(layer), 1 + slot_names.index(slot)] = scores[..., position]
    grid[:, 0] = np.nansum(grid[:, 1:], axis=1)
    future = np.isnan(scores).all(-1)  # cells no slot scores (future tokens) stay empty in the sum
    grid[:, 0][:, future] = np.nan
    return [f"layer {layer}" for layer in layers], [ALL, *slot_names], grid


def _slot_label(match: re.Match) -> str | None:
    """A score axis entry's slot (None for a whole layer): ``head 3``, ``residual``, or for encoder–decoders
    ``self-attention head 3`` / ``cross-attention residual``."""
    if match["slot"] is None:
        return None
    named = match["stack"] in ("self-attention", "cross-attention")
    return f"{match['stack']} {match['slot']}" if named else match["slot"]


def _graphs(outputs, index: int, units: list[dict]) -> list | None:
    """The routes of sequence ``index`` (from the first output that has them), their nodes labelled with the
    output's tokens where a stack has no more real positions than the output has units for it (the encoder: the
    source units; the decoder: the target units, or the only ones, of which a decoder's trace may leave out the last);
    a speech model's frames, more than its units, stay unlabelled."""
    from ..methods.graph import ContributionGraph

    for output in outputs:
        graphs = (output.info or {}).get("contribution_graphs")
        if graphs is not None and index < len(graphs):
            groups = {"source": [], "target": []}
            for unit in units:
                groups[unit["group"]].append(unit["token"])
            labels = {"encoder": groups["source"], "decoder": groups["target"] or groups["source"]}
            labelled = []
            for saved in graphs[index]:  # a stack of frames (speech) has more positions than the output has units
                graph = ContributionGraph.from_dict(saved).to_dict()  # every field checked: a saved file is shared
                lengths = graph["lengths"]
                tokens = {stack: labels[stack] for stack, length in lengths.items() if length <= len(labels[stack])}
                labelled.append({**graph, "tokens": {**tokens, **graph["tokens"]}})
            return labelled
    return None


def _image_media(image, box=None) -> dict:
    """An image as the page draws it; ``box`` ``(left, top, right, bottom)``: the part its patch grid covers."""
    from PIL import Image

    from ..frontends.vision import read_image

    picture = read_image(image, "The image")
    picture = picture if isinstance(picture, Image.Image) else Image.fromarray(np.asarray(picture))
    picture = picture.convert("RGB")
    if box is not None:
        picture = picture.crop(tuple(round(value) for value in box))
    picture.thumbnail((320, 320))
    if max(picture.size) < 240:  # a small image (a tiny model's input) drawn large enough to see its patches
        factor = math.ceil(240 / max(picture.size))
        picture = picture.resize((picture.width * factor, picture.height * factor), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return {"kind": "image", "src": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode(),
            "width": picture.width, "height": picture.height}  # fmt: skip


def _audio_media(wave, sampling_rate: int) -> dict:
    """The waveform as an envelope of 400 points (its peak per slice) and its length in seconds."""
    samples = np.asarray(wave, dtype=np.float64).reshape(-1)
    if not samples.size:
        raise ValueError("An empty waveform: give the audio the output explains.")
    slices = np.array_split(np.abs(samples), min(400, samples.size))
    peak = float(np.abs(samples).max()) or 1.0
    return {"kind": "audio", "envelope": [round(float(s.max()) / peak, 4) for s in slices],
            "seconds": samples.size / sampling_rate}  # fmt: skip


def _place_units(media: dict | None, units: list[dict], seconds: list | None = None, number: int = 1) -> dict | None:
    """Where each unit sits on the media: an image's patches (``r{row}c{column}``; a vision-language prompt's image
    ``number``'s, ``img{number} r{row}c{column}``) on their grid, an audio unit at its start time (the speech output's
    ``info["unit_seconds"]``, else read from a label like ``0.50-0.98s``)."""
    if media is None:
        return None
    places = {}
    if media["kind"] == "image":
        from .images import PATCH_LABEL

        cells = {index: PATCH_LABEL.match(unit["token"]) for index, unit in enumerate(units)}
        names = (None, "1") if number == 1 else (str(number),)  # a bare vision output's patches are image 1's
        cells = {index: (int(m["row"]), int(m["column"])) for index, m in cells.items()
                 if m and m["image"] in names}  # fmt: skip
        if cells:
            rows = 1 + max(r for r, _ in cells.values())
            cols = 1 + max(c for _, c in cells.values())
            media = {**media, "grid": [rows, cols]}
            places = {str(index): list(cell) for index, cell in cells.items()}
    else:
        sources = [index for index, unit in enumerate(units) if unit["group"] == "source"]
        if seconds is not None and len(seconds) == len(sources):
            places = {str(index): float(interval[0]) for index, interval in zip(sources, seconds, strict=True)}
        else:
            found = {index: _TIMED.search(units[index]["token"]) for index in sources}
            places = {str(index): float(match[1]) for index, match in found.items() if match}
    return {**media, "places": places}
