"""The ``inseq-mixing`` command: list methods, compare methods on a model and write a report, run the demo, attribute
a dataset."""

import argparse
import logging
import sys
import warnings

METHOD_SUMMARIES = {
    "value_zeroing": "Value Zeroing (Mohebbi et al., 2023): effect of zeroing a token's values on each layer's output",
    "alti": "ALTI / ALTI+ (Ferrando et al., 2022): token contributions to each representation, rolled out",
    "alti_logit": "ALTI-logit (Ferrando et al., 2023): signed contributions to the predicted token's logit",
    "decompx": "DecompX (Modarressi et al., 2023): exact signed logit contributions through every layer and FFN",
}


def list_methods() -> list[tuple[str, str]]:
    """``(name, one line)`` for every registered attribution method: the plugin's first, then Inseq's."""
    import inseq
    from inseq.attr.feat.feature_attribution import FeatureAttribution

    import inseq_mixing

    classes = FeatureAttribution.available_classes()
    rows = [(name, METHOD_SUMMARIES.get(name, "")) for name in inseq_mixing.METHODS]
    for name in sorted(set(inseq.list_feature_attribution_methods()) - set(inseq_mixing.METHODS)):
        doc = (classes[name].__doc__ or "").strip().splitlines()
        rows.append((name, f"Inseq: {doc[0].strip()}" if doc else "Inseq"))
    return rows


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A plain-text table of ``rows`` restricted to ``columns``."""
    cells = [columns] + [
        [f"{row.get(c):.3f}" if isinstance(row.get(c), float) else str(row.get(c, "")) for c in columns]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(value.rjust(width) for value, width in zip(line, widths, strict=True)))


SUMMARY_COLUMNS = [
    "method",
    "tokens",
    "comprehensiveness_prob",
    "random_comprehensiveness_prob",
    "sufficiency_prob",
    "random_sufficiency_prob",
]


def run_compare(args: argparse.Namespace) -> int:
    import inseq

    import inseq_mixing
    from inseq_mixing.views.report import write_report

    known = set(inseq.list_feature_attribution_methods())
    unknown = [name for name in args.methods if name not in known]
    if unknown:
        print(f"error: unknown method(s) {unknown}; run `inseq-mixing methods` to list them.", file=sys.stderr)
        return 2
    try:
        model = inseq.load_model(args.model, args.methods[0], device=args.device)
    except Exception as error:  # report what went wrong in one line, not a traceback
        print(f"error: could not load model {args.model!r}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    result = inseq_mixing.compare(
        model, args.methods, args.text, args.target, show_progress=True, random_draws=args.random_draws
    )
    path = write_report(result, args.out, title=f"inseq-mixing: {args.model}")
    if args.json:
        result.to_json(args.json)
    print_table(result.summary(), SUMMARY_COLUMNS)
    print(f"report written to {path}")
    return 0


def parse_options(pairs: list[str]) -> dict:
    """``key=value`` pairs into method options; values are read as JSON (``true``, ``3``, ``"x"``) or kept as text."""
    import json

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option takes key=value, not {pair!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = {"True": True, "False": False, "None": None}.get(value, value)
    return options


def run_attribute_dataset(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    import inseq_mixing
    from inseq_mixing.runs import DatasetInputError, RunStoreError

    hf_logging.disable_progress_bar()  # the run's own bar is the one to watch
    try:
        options = parse_options(args.option)
        summary = inseq_mixing.attribute_dataset(
            args.model,
            args.method,
            args.data,
            args.out,
            batch_size=args.batch_size,
            device=args.device,
            dtype=args.dtype,
            source_column=args.source_column,
            target_column=args.target_column,
            id_column=args.id_column,
            **options,
        )
    except (DatasetInputError, RunStoreError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(summary)
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from inseq_mixing.demo import run_demo as demo

    return demo(args.out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inseq-mixing", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("methods", help="list the registered attribution methods")
    demo = commands.add_parser("demo", help="compare every method on the embedded demo model and write a report")
    demo.add_argument("--out", default="out/demo.html")
    compare = commands.add_parser("compare", help="compare methods on a model and write an HTML report")
    compare.add_argument("text", help="source text (encoder–decoders) or prompt (decoder-only models)")
    compare.add_argument("--model", required=True, help="a Hugging Face model name or local path")
    compare.add_argument("--methods", nargs="+", default=["alti_logit", "decompx", "integrated_gradients"])
    compare.add_argument("--target", default=None, help="forced target (default: the model's generation)")
    compare.add_argument("--out", default="report.html")
    compare.add_argument("--json", default=None, help="also write the metrics as JSON here")
    compare.add_argument("--device", default=None, help="e.g. cpu or cuda (default: Inseq's choice)")
    compare.add_argument("--random-draws", type=int, default=3)
    dataset = commands.add_parser(
        "attribute-dataset", help="attribute every example of a JSONL/CSV/Parquet file into a resumable run store"
    )
    dataset.add_argument("data", help="a .jsonl, .csv or .parquet file of examples")
    dataset.add_argument("--model", required=True, help="a Hugging Face model name or local path")
    dataset.add_argument("--method", required=True, help="one of the plugin's methods (see `inseq-mixing methods`)")
    dataset.add_argument("--out", required=True, help="folder of the run store (created, or resumed)")
    dataset.add_argument("--source-column", default="source")
    dataset.add_argument("--target-column", default="target", help="missing column or value: the model generates")
    dataset.add_argument("--id-column", default=None, help="column of unique ids (default: the row number)")
    dataset.add_argument("--batch-size", type=int, default=16)
    dataset.add_argument("--device", default=None, help="e.g. cpu or cuda (default: Inseq's, or each process's)")
    dataset.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    dataset.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a method option")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if args.command == "methods":
        for name, line in list_methods():
            print(f"{name:34} {line}")
        return 0
    if args.command == "demo":
        return run_demo(args)
    if args.command == "attribute-dataset":
        return run_attribute_dataset(args)
    return run_compare(args)


if __name__ == "__main__":
    sys.exit(main())
