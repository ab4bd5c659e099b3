"""Attention flow: this package's exact solver (SciPy's compiled maximum flow on each node's sub-graph) against the
straightforward solution of the authors' code (one networkx Edmonds–Karp maximum flow per (node, input token) pair on
the whole graph), on the same head-averaged attention maps, per sentence.

The maps come from a BERT-base-sized encoder (12 layers, 12 heads, d_model 768, random weights: nothing is
downloaded) run on a sentence of ``T`` tokens; both solvers get the same capacities (0.5 · mean_h A + 0.5 · I, rows
renormalised). The largest difference between the two solutions is printed beside the times (the rounding bound is
E / 2^30). The networkx reference is slow: it is timed once per length, ours the best of ``--repeats``, for every
layer's positions (what the reference computes) and, in the last column, for the last layer's alone (the method's
default, ``per_layer=False``).

    python benchmarks/bench_flow.py [--lengths 8 12 16 32 64] [--layers 12] [--repeats 3] [--reference-max 16]
"""

import argparse
import time

import networkx as nx
import numpy as np
import torch
import transformers

from inseq_mixing.methods.flow import FlowGraph, solve_flows


def networkx_flows(layers: list[np.ndarray]) -> np.ndarray:
    """The authors' formulation: the whole layered graph in networkx, one Edmonds–Karp call per pair."""
    graph = nx.DiGraph()
    width = layers[0].shape[0]
    for layer, capacity in enumerate(layers, start=1):
        for i, j in zip(*np.nonzero(capacity), strict=True):
            graph.add_edge((layer, i), (layer - 1, j), capacity=float(capacity[i, j]))
    flows = np.zeros((len(layers), width, width))
    for layer in range(1, len(layers) + 1):
        for i in range(width):
            for j in range(width):
                flows[layer - 1, i, j] = nx.maximum_flow_value(
                    graph, (layer, i), (0, j), flow_func=nx.algorithms.flow.edmonds_karp
                )
    return flows


def layer_maps(model, length: int) -> list[np.ndarray]:
    ids = torch.randint(5, 1000, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    maps = []
    for attention in attentions:
        mean = attention[0].double().mean(0).numpy() + np.eye(length)
        maps.append(mean / mean.sum(-1, keepdims=True))
    return maps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 16, 24])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--reference-max",
        type=int,
        default=16,
        help="time the networkx reference up to this many tokens (above: ours alone)",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    config = transformers.BertConfig(num_hidden_layers=args.layers, attn_implementation="eager")
    model = transformers.BertModel(config).eval()
    print(f"torch {torch.__version__}, networkx {nx.__version__}; {args.layers} layers, BERT-base-sized, random")
    print(
        f"{'tokens':>6} {'pairs':>6} {'networkx (s)':>13} {'ours (s)':>9} {'speed-up':>9} {'max |diff|':>11} "
        f"{'last layer (s)':>15}"
    )
    for length in args.lengths:
        maps = layer_maps(model, length)
        reference, slow = None, float("nan")
        if length <= args.reference_max:
            start = time.perf_counter()
            reference = networkx_flows(maps)
            slow = time.perf_counter() - start
        best, last = float("inf"), float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            ours = solve_flows(FlowGraph(layers=maps), causal=False)
            best = min(best, time.perf_counter() - start)
            start = time.perf_counter()  # the method's default: the flows from the last layer's positions alone
            solve_flows(FlowGraph(layers=maps), causal=False, last_only=True)
            last = min(last, time.perf_counter() - start)
        pairs = args.layers * length * length
        difference = float("nan") if reference is None else np.abs(ours - reference).max()
        print(
            f"{length:>6} {pairs:>6} {slow:>13.2f} {best:>9.3f} {slow / best:>8.0f}× {difference:>11.1e} {last:>15.3f}"
        )


if __name__ == "__main__":
    main()
