"""``attention_flow``: attention flow (Abnar & Zuidema, ACL 2020), the exact maximum flows; math in
:mod:`inseq_mixing.methods.flow`."""

from dataclasses import dataclass

from .base import Declaration, EncoderMaps, InputSize, Layers, Request, layer_axis, option


@dataclass(frozen=True)
class AttentionFlowOptions(Layers, EncoderMaps):
    """The default gives the flows from the states after the last layer; ``per_layer=True``: from the states after
    every layer (cumulative, unlike the other methods' layer maps: a flow is through all the layers below)."""

    max_flows: int = option(
        200_000,
        "Refuse, before solving anything, a call in which one input needs more maximum flows than this (its "
        "positions × tokens, × layers with per_layer=True; about 1 ms each at 100 tokens on a 2-core CPU): raise "
        "it to wait longer.",
    )


def too_many_flows(size: InputSize, layers: int, options: AttentionFlowOptions) -> str | None:
    """Why one input of ``size`` needs more flows than ``max_flows`` allows (the count and what to change), or None."""
    from ..methods.flow import flow_count

    count = flow_count(size.decoder, size.encoder, layers, options.per_layer)
    if count <= options.max_flows:
        return None
    return (
        f"attention_flow needs {count:,} maximum flows for it (positions × tokens, × layers for every layer), more "
        f"than max_flows={options.max_flows:,}: give a shorter input, raise max_flows to wait for it, or use "
        "attention_rollout (the same graph, multiplied through)."
    )


def compute(request: Request, options: AttentionFlowOptions):
    from ..methods.flow import attention_flow

    layers = len(request.trace.decoder.layers)

    def check_row(row: int, positions: int, sources: int) -> None:  # the front ends checked every input before any
        reason = too_many_flows(InputSize(positions, sources), layers, options)  # work; a direct call: here
        if reason is not None:
            raise ValueError(f"Row {row} of the batch: {reason}")

    maps = attention_flow(request.trace, every_layer=options.per_layer, check_row=check_row)
    if options.per_layer:
        maps.axis = layer_axis(maps.target.shape[1])
    if not options.output_encoder_self_scores:
        maps.encoder = None
    return maps


DECLARATION = Declaration(
    name="attention_flow",
    rank=5,
    summary="Attention flow (Abnar & Zuidema, ACL 2020): maximum flows through the graph of head-averaged attention.",
    description=(
        "The layers form a graph whose edges carry the rollout's layer maps (0.5 · mean_h(A) + 0.5 · I, rows "
        "renormalised) as capacities; a token's score at a position is the maximum flow from that position's state "
        "after the last layer (per_layer=True: after each layer, last dimension: layer) down to the token's input "
        "node, rows normalised to 1 as in the authors' code. Solved exactly, one maximum flow per (position, token) "
        "pair, with SciPy's compiled solver (capacities scaled by 2^29 and rounded: each flow within E/2^30 of the "
        "exact value, E the edges of a cut). Encoder–decoders (our extension): the graph the joint rollout multiplies "
        "through, source and target flows of a row normalised together. Learned attention sinks (GPT-OSS, our "
        "extension): the capacities are not renormalised, each node's flows are normalised to its maximum flow to all "
        "the tokens at once, and the rest is sequence_scores['sink_share'] (a span's: step_scores['sink_share']). "
        "Cost: positions × tokens maximum flows (× "
        "layers with per_layer=True): seconds for a sentence, not meant for long contexts."
    ),
    options=AttentionFlowOptions,
    compute=compute,
    in_demo=False,
    size_check=too_many_flows,
    records="attention",
    reads_mixers=True,
)
