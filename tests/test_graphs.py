"""Contribution graphs (Ferrando & Voita 2024): edge importances add up as the paper states, the FFN edges equal a
naive computation through the real Hugging Face modules, the pruned route equals a naive top-down walk over the full
graph, padding changes nothing, and the graphs come back from ``model.attribute(..., contribution_graphs=True)``."""

import json

import networkx as nx
import pytest
import torch

import inseq_mixing
from inseq_mixing.methods.graph import ContributionGraph, Node, contribution_graph, graph_edges
from inseq_mixing.testing import load_tiny, tiny_encoder, tiny_model
from inseq_mixing.trace import trace_model

from .conftest import example_kwargs, get_tiny, padded_case, trace_of

ATOL = 1e-5  # float32 sums of a few dozen importances in [0, 1]


def masks_of(trace) -> dict:
    masks = {"decoder": trace.decoder.mask}
    if trace.encoder is not None:
        masks["encoder"] = trace.encoder.mask
    return masks


def test_the_importances_into_every_node_add_up_to_one(family):
    """The paper normalises each sum's parts: the attention edges (every head's part of every token, and the
    residual), the FFN and residual edges, and the cross-attention edges into each real node sum to 1."""
    trace = trace_of(get_tiny(family), example_kwargs(family, batch=2))
    edges = graph_edges(trace)
    stacks = [(edges.decoder, trace.decoder.mask)] + ([(edges.encoder, trace.encoder.mask)] if edges.encoder else [])
    for stack, mask in stacks:
        real = mask[:, None].expand(-1, stack.ffn.shape[1], -1)
        ones = torch.where(real, 1.0, 0.0)
        torch.testing.assert_close(stack.attention.sum((2, 4)), ones, atol=ATOL, rtol=0)
        torch.testing.assert_close(stack.ffn.sum(-1), ones, atol=ATOL, rtol=0)
        assert (stack.attention >= 0).all() and (stack.ffn >= 0).all()
        if stack.cross is not None:
            torch.testing.assert_close(stack.cross.sum((2, 4)), ones, atol=ATOL, rtol=0)
    assert (edges.decoder.cross is not None) == trace.spec.is_encoder_decoder


def proximity_share(parts: list[torch.Tensor], output: torch.Tensor) -> torch.Tensor:
    """The paper's importance, written out: max(0, ‖y‖₁ − ‖y − z‖₁), normalised over the parts."""
    scores = torch.stack([(output.abs().sum(-1) - (output - part).abs().sum(-1)).clamp(min=0) for part in parts], -1)
    return scores / scores.sum(-1, keepdim=True)


def naive_ffn_edges(model, family: str, ids: torch.Tensor) -> torch.Tensor:
    """``(L, T, 2)`` FFN and residual importances from forward hooks on the real modules: the FFN module's output
    and the layer's output (pre-LN and parallel blocks: the residual is the output minus the FFN's); BERT's post-LN
    output block: the dense output and the attention output, each through the LayerNorm at the statistics of their
    sum (its shift left out, as the paper's parts are)."""
    if family == "bert":
        blocks = [(layer.output, layer) for layer in model.bert.encoder.layer]
    elif family == "gpt2":
        blocks = [(layer.mlp, layer) for layer in model.transformer.h]
    elif family == "gpt_neox":
        blocks = [(layer.mlp, layer) for layer in model.gpt_neox.layers]
    else:
        blocks = [(layer.mlp, layer) for layer in model.model.layers]
    seen, handles = [], []
    for ffn, layer in blocks:
        record = {}
        seen.append(record)
        handles.append(ffn.register_forward_hook(lambda _m, args, out, r=record: r.update(ffn=out, args=args)))
        handles.append(layer.register_forward_hook(lambda _m, _a, out, r=record: r.update(
            layer=out[0] if isinstance(out, tuple) else out)))  # fmt: skip
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        for handle in handles:
            handle.remove()
    per_layer = []
    for record, (ffn, _) in zip(seen, blocks, strict=True):
        output = record["layer"][0]
        if family == "bert":
            branch, residual = ffn.dense(record["args"][0])[0], record["args"][1][0]
            total = branch + residual
            scale = torch.rsqrt(total.var(-1, unbiased=False, keepdim=True) + ffn.LayerNorm.eps)
            norm = ffn.LayerNorm
            parts = [norm.weight * (part - part.mean(-1, keepdim=True)) * scale for part in (branch, residual)]
        else:
            branch = record["ffn"][0]
            parts = [branch, output - branch]
        per_layer.append(proximity_share(parts, output))
    return torch.stack(per_layer)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox", "bert"])
def test_ffn_edges_equal_the_definition_through_the_real_modules(family):
    model = tiny_encoder("bert", "masked_lm").double() if family == "bert" else tiny_model(family).double()
    ids = torch.tensor([[5, 9, 14, 7, 22, 31, 8]])
    trace = trace_model(model, ids, torch.ones_like(ids))
    ours = graph_edges(trace).decoder.ffn[0]
    torch.testing.assert_close(ours, naive_ffn_edges(model, family, ids), atol=1e-10, rtol=0)


def full_graph(edges, trace, row: int) -> nx.MultiDiGraph:
    """Every edge of the dense importances as a networkx graph, wired from the definition (node =
    (stack, layer, stage, position)), written independently of the route's walk."""
    graph = nx.MultiDiGraph()

    def add(stack_edges, stack, mask):
        real = mask[row].nonzero().flatten().tolist()
        number = {pos: index for index, pos in enumerate(real)}
        layers = stack_edges.ffn.shape[1]
        for layer in range(layers):
            below = (stack, layer - 1, "ffn") if layer else (stack, -1, "embedding")
            mid = (stack, layer, "cross" if stack_edges.cross is not None else "attention")
            heads = stack_edges.attention.shape[2] - 1
            for i in real:
                after_attention = (stack, layer, "attention", number[i])
                for j in real:
                    for head in range(heads):
                        weight = float(stack_edges.attention[row, layer, head, i, j])
                        graph.add_edge((*below, number[j]), after_attention, kind="attention", head=head, w=weight)
                graph.add_edge((*below, number[i]), after_attention, kind="residual", head=None,
                               w=float(stack_edges.attention[row, layer, heads, i, i]))  # fmt: skip
                if stack_edges.cross is not None:
                    source = trace.encoder.mask[row].nonzero().flatten().tolist()
                    top = edges.encoder.ffn.shape[1] - 1
                    after_cross = (stack, layer, "cross", number[i])
                    for index, s in enumerate(source):
                        for head in range(heads):
                            graph.add_edge(("encoder", top, "ffn", index), after_cross, kind="cross", head=head,
                                           w=float(stack_edges.cross[row, layer, head, i, s]))  # fmt: skip
                    graph.add_edge(after_attention, after_cross, kind="residual", head=None,
                                   w=float(stack_edges.cross[row, layer, heads, i, -1]))  # fmt: skip
                for slot, kind in enumerate(("ffn", "residual")):
                    graph.add_edge((*mid, number[i]), (stack, layer, "ffn", number[i]), kind=kind, head=None,
                                   w=float(stack_edges.ffn[row, layer, i, slot]))  # fmt: skip

    add(edges.decoder, "decoder", trace.decoder.mask)
    if edges.encoder is not None:
        add(edges.encoder, "encoder", trace.encoder.mask)
    return graph


def naive_route(graph: nx.MultiDiGraph, top: tuple, threshold: float) -> set:
    """Top-down over the nodes in reverse topological order: a node on the route keeps its incoming edges above the
    threshold, and their sources join the route."""
    route, kept = {top}, set()
    for node in reversed(list(nx.topological_sort(graph))):
        if node in route:
            for source, _, data in graph.in_edges(node, data=True):
                if data["w"] > threshold:
                    kept.add((source, node, data["kind"], data["head"], round(data["w"], 5)))
                    route.add(source)
    return kept


def summed_over_heads(graph: nx.MultiDiGraph) -> nx.MultiDiGraph:
    summed = nx.MultiDiGraph()
    totals = {}
    for source, target, data in graph.edges(data=True):
        if data["kind"] in ("attention", "cross"):
            key = (source, target, data["kind"])
            totals[key] = totals.get(key, 0.0) + data["w"]
        else:
            summed.add_edge(source, target, **data)
    for (source, target, kind), weight in totals.items():
        summed.add_edge(source, target, kind=kind, head=None, w=weight)
    return summed


def as_set(graph: ContributionGraph) -> set:
    def key(node):
        return (node.stack, node.layer, node.stage, node.position)

    return {(key(e.source), key(e.target), e.kind, e.head, round(e.weight, 5)) for e in graph.edges}


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "marian", "t5"])
@pytest.mark.parametrize("threshold", [0.0, 0.04, 0.15, 0.55])
@pytest.mark.parametrize("heads", [True, False])
def test_the_route_is_the_naive_top_down_walk_over_the_full_graph(family, threshold, heads):
    trace = trace_of(get_tiny(family), example_kwargs(family))
    edges = graph_edges(trace)
    position = trace.decoder.mask.shape[1] - 2
    route = contribution_graph(edges, masks_of(trace), 0, position, threshold, heads)
    full = full_graph(edges, trace, 0)
    full = full if heads else summed_over_heads(full)
    layers = edges.decoder.ffn.shape[1]
    expected = naive_route(full, ("decoder", layers - 1, "ffn", position), threshold)
    assert as_set(route) == expected
    assert len(route.edges) == len(expected) and (threshold > 0.5 or expected)  # no edge twice
    assert all(edge.weight > threshold for edge in route.edges)
    if family in ("marian", "t5") and threshold < 0.1:
        assert any(edge.kind == "cross" for edge in route.edges)
        assert any(node.stack == "encoder" and node.stage == "embedding" for node in route.nodes)
    assert route.explained == Node("decoder", layers - 1, "ffn", position)


def test_padding_changes_no_route(decoder_family="llama"):
    model = get_tiny(decoder_family)
    case = padded_case(model, decoder_family)
    edges, alone_edges = graph_edges(case.batched), [graph_edges(trace) for trace in case.alone]
    for index, (_, span) in enumerate(case.spans):
        last = span.stop - 1
        batched = contribution_graph(edges, masks_of(case.batched), index, last, 0.04)
        alone = contribution_graph(alone_edges[index], masks_of(case.alone[index]), 0,
                                   case.alone[index].decoder.mask.shape[1] - 1, 0.04)  # fmt: skip
        ours, reference = weights_of(batched), weights_of(alone)
        for key in ours.keys() ^ reference.keys():  # only an edge at the threshold may flip
            assert abs(ours.get(key, reference.get(key)) - 0.04) < 1e-5, key
        for key in ours.keys() & reference.keys():
            assert ours[key] == pytest.approx(reference[key], abs=1e-5), key
        assert len(ours) > 3 and batched.explained == alone.explained


def weights_of(graph: ContributionGraph) -> dict:
    return {(e.source, e.target, e.kind, e.head): e.weight for e in graph.edges}


def test_graph_exports_round_trip_and_refuse_bad_arguments(tmp_path):
    trace = trace_of(get_tiny("marian"), example_kwargs("marian"))
    edges = graph_edges(trace)
    graph = contribution_graph(edges, masks_of(trace), 0, 2, 0.04)
    graph.tokens = {"decoder": [f"t{i}" for i in range(5)], "encoder": [f"s{i}" for i in range(7)]}
    loaded = ContributionGraph.from_dict(json.loads(graph.to_json(tmp_path / "graph.json")))
    assert loaded == graph and json.loads((tmp_path / "graph.json").read_text()) == graph.to_dict()
    exported = graph.to_networkx()
    assert exported.number_of_edges() == len(graph.edges) and exported.number_of_nodes() == len(graph.nodes)
    assert exported.nodes[graph.explained.key]["token"] == "t2"
    incoming = sum(weight for *_, weight in exported.in_edges(graph.explained.key, data="weight"))
    assert incoming == pytest.approx(sum(e.weight for e in graph.incoming(graph.explained)))
    with pytest.raises(ValueError, match=r"threshold=1.5.*\[0, 1\)"):
        contribution_graph(edges, masks_of(trace), 0, 2, 1.5)
    with pytest.raises(ValueError, match="Position 9 of row 0 is not a real token"):
        contribution_graph(edges, masks_of(trace), 0, 9)


def test_attribute_returns_the_graph_of_every_explained_token():
    model = load_tiny("gpt2", "value_zeroing")
    out = model.attribute("the cat", "the cat sat on the", show_progress=False, contribution_graphs=True)
    sequence = out.sequence_attributions[0]
    graphs = inseq_mixing.contribution_graphs(out)
    assert graphs[0].to_dict() | {"tokens": {}} == out.info["contribution_graphs"][0][0] | {"tokens": {}}
    assert graphs[0].tokens["decoder"] == [token.token for token in sequence.target]
    assert graphs[-1].label(graphs[-1].explained) == sequence.target[sequence.attr_pos_end - 2].token
    assert len(graphs) == sequence.attr_pos_end - sequence.attr_pos_start
    # the column of generated token t is explained by the state at t - 1
    predicting = range(sequence.attr_pos_start - 1, sequence.attr_pos_end - 1)
    assert [graph.explained.position for graph in graphs] == list(predicting)
    plain = model.attribute("the cat", "the cat sat on the", show_progress=False)
    assert "contribution_graphs" not in plain.info
    with pytest.raises(ValueError, match="no contribution graphs: make it with"):
        inseq_mixing.contribution_graphs(plain)
    torch.testing.assert_close(plain.sequence_attributions[0].target_attributions, sequence.target_attributions,
                               equal_nan=True)  # fmt: skip
    with pytest.raises(ValueError, match="contribution_graphs=.*'threshold'"):
        model.attribute("the cat", "the cat sat", show_progress=False, contribution_graphs={"tau": 0.1})
