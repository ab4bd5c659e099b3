"""The ``inseq-mixing`` command: list methods, compare methods on a model and write a report, run the demo, attribute
a dataset, evaluate methods on annotated data, export the demo's annotated data."""

import argparse
import logging
import os
import shlex
import sys
import warnings
from pathlib import Path

from inseq_mixing.views.tables import SUMMARY_COLUMNS, p_value_text, print_legend, print_table

#: Inseq 0.7's own methods (kept here so that ``inseq-mixing methods`` answers without importing torch; a test checks
#: this list against Inseq's registry): name → what it computes, in our words.
INSEQ_METHODS = {
    "integrated_gradients": "gradients integrated along a straight path from a baseline (Captum)",
    "deeplift": "DeepLIFT's rescale rule against a baseline (Captum)",
    "saliency": "the gradient of the explained score (Captum)",
    "input_x_gradient": "the input embedding times its gradient (Captum)",
    "gradient_shap": "expected gradients over noisy baselines (Captum)",
    "discretized_integrated_gradients": "integrated gradients along a path through real token embeddings",
    "sequential_integrated_gradients": "integrated gradients, one token interpolated at a time",
    "layer_integrated_gradients": "integrated gradients at the embedding layer's output (Captum)",
    "layer_gradient_x_activation": "an embedding layer's output times its gradient (Captum)",
    "layer_deeplift": "DeepLIFT at the embedding layer's output (Captum)",
    "occlusion": "the score's change when a token's embedding is replaced (Captum)",
    "lime": "a local linear surrogate fitted on perturbed inputs",
    "reagent": "ReAGent: recursive replacement of tokens by a language model's guesses",
    "attention": "the model's raw attention weights",
    "inseq_value_zeroing": "Inseq's own value zeroing (renamed by inseq-mixing; its value_zeroing is this package's)",
    "dummy": "empty attributions (for testing)",
}


def list_methods() -> list[tuple[str, str]]:
    """``(name, summary)`` for every method the commands take: the plugin's (from their declarations) first, then
    Inseq's own (:data:`INSEQ_METHODS`). Imports neither torch nor Inseq."""
    from inseq_mixing.declarations import DECLARATIONS

    rows = [(name, declaration.summary) for name, declaration in DECLARATIONS.items()]
    return rows + [(name, f"Inseq: {summary}") for name, summary in INSEQ_METHODS.items()]


def method_options_text() -> str:
    """Every plugin method's options (type, default, choices, one line each), from the declarations."""
    from inseq_mixing.declarations import DECLARATIONS

    return "\n\n".join(f"{name}\n{declaration.options_doc()}" for name, declaration in DECLARATIONS.items())


class UserError(ValueError):
    """A problem with the command's arguments, reported in one line with exit code 2."""


def check_writable(path: str | None) -> None:
    """Refuse an output file that cannot be written, before any computation (its folder is created if missing)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{path} is a folder: give a file path")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot create the folder of {path}: {error.strerror}") from error
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UserError(f"{path} cannot be written (permission denied)")


def check_methods_known(methods: list[str]) -> None:
    """Refuse method names Inseq does not know, in one line."""
    import inseq

    from inseq_mixing.frontends.patches import register

    register()
    unknown = [name for name in methods if name not in inseq.list_feature_attribution_methods()]
    if unknown:
        raise UserError(f"unknown method(s) {unknown}; run `inseq-mixing methods` to list them")


#: What an unknown method name is told, wherever Inseq's own entry points meet this package's names.
UNREGISTERED_HINT = (
    "Inseq knows inseq-mixing's methods only once the plugin is imported: in Python, `import inseq_mixing` before "
    "inseq.load_model; on the command line, `inseq-mixing attribute` instead of `inseq attribute`."
)


def run_inseq_attribute(argv: list[str]) -> int:
    """``inseq-mixing attribute``: Inseq's own ``inseq attribute`` (the same flags, the same heatmap, ``--save_path``
    and ``--viz_path`` outputs: Inseq's code runs it) with the plugin's methods registered; ``-m demo`` is the
    embedded demo model (offline)."""
    from inseq_mixing.frontends.patches import register

    register()  # before Inseq's command module reads its registry into the flag's choices
    import inseq
    from inseq.commands.attribute import AttributeCommand
    from inseq.utils import InseqArgumentParser

    from inseq_mixing.demo import MODEL_DIR

    parser = InseqArgumentParser(
        prog="inseq-mixing attribute",
        description="Inseq's `inseq attribute`, with inseq-mixing's methods (`inseq-mixing methods` lists them).",
        dataclass_types=AttributeCommand._dataclasses,
    )
    for flags in (("-a", "--attribution_method"), ("--attribution-method",)):
        method = _flag_value(argv, flags)
        if method is not None and method not in inseq.list_feature_attribution_methods():
            print(f"error: unknown method {method!r}; run `inseq-mixing methods` to list them. {UNREGISTERED_HINT}",
                  file=sys.stderr)  # fmt: skip
            return 2
    (args,) = parser.parse_args_into_dataclasses(argv)
    if args.model_name_or_path == "demo":
        args.model_name_or_path = str(MODEL_DIR)
    refusal = non_generation_refusal(args.model_name_or_path)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    AttributeCommand.run(args)
    return 0


def non_generation_refusal(name: str) -> str | None:
    """Why ``inseq-mixing attribute`` (Inseq's command, for generation models) cannot take ``name``, an encoder-only
    or speech model, and what takes it; None for any other model."""
    from inseq_mixing.frontends import identify

    record = identify(name).record
    if record.commands is None:
        return None
    kind, commands = record.label, record.commands
    return (
        f"{name} is {kind} model, and `inseq-mixing attribute` is Inseq's command for generation models "
        f"(encoder–decoders and decoder-only). Use {commands} with --model, or in Python "
        "inseq_mixing.load_model(model, method).attribute(...)."
    )


def _flag_value(argv: list[str], flags: tuple[str, ...]) -> str | None:
    """The value given to one of ``flags`` (``-a x`` or ``--flag=x``), or None."""
    for index, item in enumerate(argv):
        if item in flags and index + 1 < len(argv):
            return argv[index + 1]
        for flag in flags:
            if item.startswith(f"{flag}="):
                return item.split("=", 1)[1]
    return None


def inseq_mixing_version() -> str:
    """The installed package's version (a source tree without installed metadata: ``0.0.0+local``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inseq-mixing")
    except PackageNotFoundError:
        return "0.0.0+local"


def load_model(name: str, method: str, device: str | None, processor: str | None = None):
    """The Inseq model of a hub name or local folder (``demo``: the embedded demo model, offline), with a one-line
    error for what a user can fix: a model that cannot be loaded, a tokenizer that does not match it."""
    from inseq_mixing.frontends import identify
    from inseq_mixing.frontends import load_model as load_any_model
    from inseq_mixing.frontends.kinds import resolve

    found = identify(name)
    try:
        model = load_any_model(name, method, device=device, found=found, processor=speech_processor(processor))
    except Exception as error:  # report what went wrong in one line, not a traceback
        if name == "demo":
            raise UserError(
                f"could not load the demo model with {method!r}: {type(error).__name__}: {error}"
            ) from error
        hint = found.record.folder_hint if Path(name).is_dir() else ""
        raise UserError(f"could not load model {name!r}{hint}: {type(error).__name__}: {error}") from error
    if found.record.check_loaded is not None and name != "demo":
        try:
            resolve(found.record.check_loaded)(model)
        except ValueError as error:
            raise UserError(str(error)) from error
    return model


def speech_processor(name: str | None):
    """The processor of ``--processor`` (a speech model's, when its own folder has none), or None."""
    if name is None:
        return None
    from inseq_mixing.frontends.speech import load_processor

    return load_processor(name)


def load_for_compare(args: argparse.Namespace):
    """The Inseq model of ``args.model`` for the first method, with a one-line error for what a user can fix."""
    check_methods_known(args.methods)
    model = load_model(args.model, args.methods[0], args.device, args.processor)
    if not hasattr(model, "is_encoder_decoder"):  # an encoder-only model: no generation, no prompt to fit
        return model
    if not model.is_encoder_decoder and args.target is not None and not args.target.startswith(args.text):
        raise UserError("for a decoder-only model, --target is the whole text and must start with the prompt")
    if args.target is None:
        from inseq_mixing.frontends.generation import check_prompts_fit

        try:
            check_prompts_fit(model, [(args.text, "the text")])
        except ValueError as error:
            raise UserError(str(error).replace("Give its target (the full text)", "Give --target")) from error
    return model


def run_compare(args: argparse.Namespace) -> int:
    from inseq_mixing.evaluation import compare
    from inseq_mixing.views.report import write_report

    try:
        args.out, args.json = available_path(args.out, args.overwrite), available_path(args.json, args.overwrite)
        check_writable(args.out)
        check_writable(args.json)
        model = load_for_compare(args)
        result = compare(
            model,
            args.methods,
            (args.image, args.text) if args.image else args.text,
            args.target,
            show_progress=True,
            random_draws=args.random_draws,
            max_new_tokens=args.max_new_tokens,
            attributed_fn=None if args.attributed_fn == "own" else args.attributed_fn,
            method_kwargs=method_options(args.option),
        )
    except (UserError, RuntimeError, ValueError, OSError) as error:  # RuntimeError: every method failed; ValueError:
        print(f"error: {error}", file=sys.stderr)  # an input refused (a missing image or audio file, a bad label)
        return 2
    path = write_report(result, args.out, title=f"inseq-mixing: {args.model}")
    if args.json:
        result.to_json(args.json)
    print_table(result.summary(), SUMMARY_COLUMNS)
    print_legend(SUMMARY_COLUMNS)
    for method, reason in result.failed.items():
        print(f"failed: {method}: {reason}", file=sys.stderr)
    print(f"report written to {path}" + (f", metrics to {args.json}" if args.json else ""))
    return 1 if result.failed else 0


#: The column roles ``evaluate`` takes a ``--ROLE-column`` flag for: every protocol's (tests check the registry's).
EVALUATE_COLUMNS = ("source", "prefix", "target", "foil", "evidence", "cues", "alignment", "audio", "words",
                    "transcript", "image", "label", "box", "patches", "passages", "question", "answer", "gold",
                    "images", "prompt")  # fmt: skip


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
    from inseq_mixing.runs import DatasetInputError, RunStoreError
    from inseq_mixing.runs.data import check_data_file

    try:
        check_data_file(args.data)  # a typo answered before torch and Inseq are imported
        from inseq_mixing.runs import attribute_dataset

        options = parse_options(args.option)
        model = args.model  # a name, a folder, or "demo" (the run's manifest names it so, not its install path)
        summary = attribute_dataset(
            model,
            args.method,
            args.data,
            args.out,
            batch_size=args.batch_size,
            device=args.device,
            dtype=args.dtype,
            source_column=args.source_column,
            target_column=args.target_column,
            id_column=args.id_column,
            words_column=args.words_column,
            images_column=args.images_column,
            max_new_tokens=args.max_new_tokens,
            processor=speech_processor(args.processor),
            **options,
        )
    except (DatasetInputError, RunStoreError, ValueError, OSError, UserError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(args.out), file=sys.stderr)
        return 130
    print(summary)
    return 0


def interrupted_message(out: str) -> str:
    """What an interrupted dataset run left, and the command that resumes it."""
    from inseq_mixing.runs.store import RunStore

    store = RunStore(out)
    manifest = store.read_manifest() if store.manifest_path.is_file() else None
    if manifest is None:
        return f"interrupted before anything was stored in {out}."
    stored = sum(index.get("rows", 0) for index in store.scan(checksums=False).valid.values())
    command = " ".join(shlex.quote(part) for part in ["inseq-mixing", *sys.argv[1:]])
    return (
        f"interrupted: {stored} of {manifest['examples']} examples are stored in {out}. Nothing stored is lost; "
        f"resume with the same command:\n  {command}"
    )


def run_demo(args: argparse.Namespace) -> int:
    from inseq_mixing.views.demo import run_demo as demo

    try:
        check_writable(args.out)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return demo(args.out)


def method_options(pairs: list[str]) -> dict[str, dict]:
    """``METHOD:KEY=VALUE`` pairs into per-method options."""
    options = {}
    for pair in pairs:
        method, sep, rest = pair.partition(":")
        if not sep:
            raise UserError(f"--option takes METHOD:KEY=VALUE (e.g. integrated_gradients:n_steps=20), not {pair!r}")
        options.setdefault(method, {}).update(parse_options([rest]))
    return options


def run_evaluate(args: argparse.Namespace) -> int:
    from inseq_mixing.runs.data import DatasetInputError, check_data_file
    from inseq_mixing.runs.store import MANIFEST, is_run_folder

    try:  # what a typo gets wrong, answered before torch and Inseq are imported
        if args.run is not None and args.data is not None:
            raise UserError("--run evaluates a stored run on its own rows: give no data file with it.")
        if args.run is not None and not is_run_folder(args.run):
            raise UserError(f"{args.run} is not a run store (no {MANIFEST}): give attribute-dataset's --out folder.")
        if args.data is not None:
            check_data_file(args.data)
    except (UserError, DatasetInputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from inseq_mixing.evaluation import EvaluationInputError, evaluate

    try:
        args.out, args.json = available_path(args.out, args.overwrite), available_path(args.json, args.overwrite)
        check_writable(args.out)
        check_writable(args.json)
        if args.run is not None:
            from inseq_mixing.evaluation.stored import evaluate_run

            args.protocol = args.protocol or "faithfulness"
            result = evaluate_run(args.run, args.protocol, model=args.model, device=args.device, draws=args.draws,
                                  show_progress=True)  # fmt: skip
            return report_evaluation(result, args, title=f"inseq-mixing evaluation: {args.protocol}, run {args.run}")
        if args.data is None or args.model is None or args.protocol is None:
            raise UserError("give the data file, --model and --protocol (or --run DIR for a stored run)")
        check_methods_known(args.methods)
        options = method_options(args.option)
        model = load_model(args.model, args.methods[0], args.device, args.processor)
        from inseq_mixing.evaluation.protocols import lookup
        from inseq_mixing.frontends import identify

        entry = lookup(identify(model), args.protocol)  # the protocol's columns and settings, by the model's kind
        columns = {role: getattr(args, f"{role}_column") for role in entry.columns}
        extra = {name: getattr(args, name) for name in ("replacement", "steps", "hops") if name in entry.options}
        result = evaluate(
            model,
            args.methods,
            args.data,
            args.protocol,
            batch_size=args.batch_size,
            method_kwargs=options,
            draws=args.draws,
            show_progress=True,
            target_tokens=args.target_tokens,
            random_baseline=args.random_baseline,
            random_draws=args.random_draws,
            **extra,
            **columns,
        )
    except (UserError, EvaluationInputError, RuntimeError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return report_evaluation(result, args, title=f"inseq-mixing evaluation: {args.protocol}, {args.model}")


def report_evaluation(result, args: argparse.Namespace, title: str) -> int:
    """Write an evaluation's report (and JSON), print its table, tests, failures and skipped rows."""
    from inseq_mixing.views.eval_report import write_evaluation_report

    path = write_evaluation_report(result, args.out, title=title)
    if args.json:
        result.to_json(args.json)
    rows = result.summary_rows()
    print_table(rows, list(dict.fromkeys(key for row in rows for key in row)))
    for note in result.notes():
        print(f"note: {note}")
    for pair in result.pairs():
        print(f"{pair['method_a']} − {pair['method_b']}: {pair['difference']:+.3f} ({p_value_text(pair['p_value'])})")
    for method, reason in result.failed.items():
        print(f"failed: {method}: {reason}", file=sys.stderr)
    if result.skipped:
        counts = ", ".join(f"{kind}: {count}" for kind, count in result.skipped_counts().items())
        print(f"skipped {len(result.skipped)} row(s) ({counts}); the report lists each with its reason")
    if result.unknown_words:
        print(
            f"{len(result.unknown_words)} row(s) have context words mapped to the unknown token (listed in the report)"
        )
    print(f"report written to {path}" + (f", metrics to {args.json}" if args.json else ""))
    return 1 if result.failed else 0


def run_explore(args: argparse.Namespace) -> int:
    """``inseq-mixing explore``: the explorer page of a model's methods on one input, or of saved outputs."""
    from inseq_mixing.views.explorer import DEFAULT_METHODS, explore, explore_model

    try:
        args.out = available_path(args.out, args.overwrite)
        check_writable(args.out)
        if args.saved:
            if args.model or args.input:
                raise UserError("give either --saved outputs or a model and an input, not both")
            from inseq_mixing.frontends.output import load_output

            outputs = []
            for path in args.saved:
                try:
                    outputs.append(load_output(path))  # through the allow-list of output classes
                except Exception as error:
                    reason = f"{type(error).__name__}: {error}"
                    raise UserError(f"could not read {path} as a saved output: {reason}") from error
            explore(outputs, args.out, title="inseq-mixing explorer")
        else:
            if not args.model or args.input is None:
                raise UserError("give --model and an input (or --saved outputs)")
            methods = args.methods or list(DEFAULT_METHODS)
            check_methods_known(methods)
            options = {name: dict(DEFAULT_METHODS.get(name, {})) if args.methods is None else {} for name in methods}
            for name, values in method_options(args.option).items():
                if name not in options:
                    raise UserError(f"--option {name}:...: {name!r} is not among the methods {methods}")
                options[name].update(values)
            graphs = False if args.no_graphs else {"threshold": args.threshold, "heads": True}
            model = load_model(args.model, methods[0], args.device, args.processor)
            explore_model(model, args.input, args.target, args.out, methods=options, contribution_graphs=graphs,
                          title=f"inseq-mixing explorer: {args.model}")  # fmt: skip
    except (UserError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"explorer written to {args.out}")
    return 0


def run_demo_data(args: argparse.Namespace) -> int:
    from inseq_mixing.demo.evaluation_data import export_evaluation_data

    for name, path in export_evaluation_data(args.out, count=args.count).items():
        print(f"{name}: {path}")
    return 0


MODEL_HELP = (
    "a Hugging Face model name or local folder, or demo (the embedded demo model, offline), or demo-retrieval "
    "(the embedded retrieval model of the context protocol)"
)
PROCESSOR_HELP = "a speech model's processor (name or folder), when the model's own folder has none"
MAX_NEW_TOKENS_HELP = (
    "longest generated target where none is given (default: the model's generation config; without one, "
    "transformers' 20 new tokens, said once)"
)
#: Warnings of this package that the commands show (in one line) although they silence the libraries' warnings.
SHOWN_WARNINGS = (r"The model's generation config sets no length",)


def available_path(path: str | None, overwrite: bool) -> str | None:
    """``path``, or, if that file exists and ``overwrite`` is off, the first free ``NAME-1.EXT``, ``NAME-2.EXT``, ...
    (said on screen): an output file is only replaced when asked."""
    if path is None or overwrite or not Path(path).is_file():  # a folder is refused by check_writable
        return path
    target, number = Path(path), 1
    while (candidate := target.with_name(f"{target.stem}-{number}{target.suffix}")).exists():
        number += 1
    print(f"{path} exists: writing {candidate} instead (pass --overwrite to replace it)")
    return str(candidate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inseq-mixing", description=__doc__)
    parser.add_argument("--version", action="version", version=f"inseq-mixing {inseq_mixing_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "attribute",
        help="Inseq's `inseq attribute` with inseq-mixing's methods: the same flags and outputs "
        "(`inseq-mixing attribute --help`)",
        add_help=False,
    )
    methods = commands.add_parser("methods", help="list the attribution methods")
    methods.add_argument("--options", action="store_true", help="list each plugin method's options instead")
    demo = commands.add_parser("demo", help="compare every method on the embedded demo model and write a report")
    demo.add_argument("--out", default="out/demo.html", help="the HTML report (default: %(default)s)")
    compare = commands.add_parser("compare", help="compare methods on a model and write an HTML report")
    compare.add_argument("text", help="source text (encoder–decoders) or prompt (decoder-only models)")
    compare.add_argument("--model", required=True, help=MODEL_HELP)
    compare.add_argument("--processor", default=None, help=PROCESSOR_HELP)
    compare.add_argument(
        "--methods",
        nargs="+",
        default=["alti_logit", "decompx", "integrated_gradients"],
        help="methods to compare (default: %(default)s; inseq-mixing methods lists them)",
    )
    compare.add_argument("--target", default=None, help="forced target (default: the model's generation)")
    compare.add_argument("--image", action="append", default=[],
                         help="vision-language models: an image of the prompt, one per placeholder in its text, in "
                              "order (repeat the flag); the answer is --target")  # fmt: skip
    compare.add_argument("--out", default="report.html", help="the HTML report (default: %(default)s)")
    compare.add_argument("--json", default=None, help="also write the metrics as JSON here")
    compare.add_argument("--device", default=None, help="e.g. cpu or cuda (default: Inseq's choice)")
    compare.add_argument("--random-draws", type=int, default=3)
    compare.add_argument("--max-new-tokens", type=int, default=None, help=MAX_NEW_TOKENS_HELP)
    compare.add_argument("--attributed-fn", default="logit",
                         help="what every method explains, one quantity for all (default: logit; 'own': each "
                              "method's default, e.g. Inseq's probability for gradient methods)")  # fmt: skip
    compare.add_argument("--overwrite", action="store_true", help="replace --out / --json if they exist")
    compare.add_argument("--option", action="append", default=[], metavar="METHOD:KEY=VALUE",
                         help="a method option (e.g. value_zeroing:per_layer=true)")  # fmt: skip
    dataset = commands.add_parser(
        "attribute-dataset", help="attribute every example of a JSONL/CSV/Parquet file into a resumable run store"
    )
    dataset.add_argument(
        "data", help="a .jsonl, .csv or .parquet file of examples (speech models: rows of audio file paths)"
    )
    dataset.add_argument("--model", required=True, help=MODEL_HELP)
    dataset.add_argument("--processor", default=None, help=PROCESSOR_HELP)
    dataset.add_argument(
        "--method", required=True, help="a method (see `inseq-mixing methods`): the plugin's, or Inseq's own"
    )
    dataset.add_argument("--out", required=True, help="folder of the run store (created, or resumed)")
    dataset.add_argument(
        "--source-column", default=None, help="the text or prompt (default: source; speech models: audio, a path)"
    )
    dataset.add_argument(
        "--target-column",
        default=None,
        help="default: target (Whisper: transcript; CTC models: frames, their indices); a missing column or value: "
        "the model generates",
    )
    dataset.add_argument(
        "--words-column",
        default="words",
        help="speech models: each utterance's word intervals, a JSON list of [word, start_s, end_s] (default: "
        "words; without it, windows of window_s seconds: --option window_s=0.5)",
    )
    dataset.add_argument(
        "--images-column",
        default="images",
        help="vision-language models: each prompt's image files, a path or a JSON list of paths (default: images; "
        "the prompt is --source-column, default prompt, the answer --target-column, default answer)",
    )
    dataset.add_argument("--id-column", default=None, help="column of unique ids (default: the row number)")
    dataset.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="examples per batch and per shard; part of the run's identity (default: %(default)s)",
    )
    dataset.add_argument("--max-new-tokens", type=int, default=None, help=MAX_NEW_TOKENS_HELP)
    dataset.add_argument("--device", default=None, help="e.g. cpu or cuda (default: Inseq's, or each process's)")
    dataset.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    dataset.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a method option")
    evaluate = commands.add_parser("evaluate", help="score methods on annotated data with a paper's protocol")
    evaluate.add_argument("data", nargs="?", default=None, help="a .jsonl, .csv or .parquet file of annotated rows")
    evaluate.add_argument("--model", default=None, help=MODEL_HELP + " (with --run: default, the run's own model)")
    evaluate.add_argument("--processor", default=None, help=PROCESSOR_HELP)
    evaluate.add_argument("--run", default=None, metavar="DIR",
                          help="evaluate a stored run of attribute-dataset (its method, faithfulness protocol) on its "
                          "stored attributions: nothing is attributed again; no data file")  # fmt: skip
    evaluate.add_argument(
        "--methods",
        nargs="+",
        default=["alti_logit", "decompx", "value_zeroing", "alti"],
        help="methods to evaluate (default: %(default)s)",
    )
    evaluate.add_argument("--protocol", default=None,
                          choices=["evidence", "cue", "alignment", "faithfulness", "blankout", "pointing", "context"],
                          help="blankout: speech models (Whisper) only; pointing: image classifiers only; context: "
                          "generation models, rows of passages, question, answer and gold passage(s); with --run: "
                          "faithfulness")  # fmt: skip
    evaluate.add_argument("--hops", type=int, default=0,
                          help="context: hops through the answer's own tokens (default: %(default)s)")  # fmt: skip
    evaluate.add_argument(
        "--random-baseline",
        action="store_true",
        help="speech cue and image protocols: also run every method on a randomly initialised copy of the model",
    )
    evaluate.add_argument("--replacement", choices=["mean", "blur"], default="mean",
                          help="image faithfulness: a removed patch becomes the image's mean colour or its blur "
                          "(default: %(default)s)")  # fmt: skip
    evaluate.add_argument("--steps", type=int, default=10,
                          help="image faithfulness: points of each deletion / insertion curve beyond 0 "
                          "(default: %(default)s)")  # fmt: skip
    evaluate.add_argument("--random-draws", type=int, default=3, dest="random_draws",
                          help="image faithfulness: random rankings per image (default: %(default)s)")  # fmt: skip
    evaluate.add_argument("--out", default="evaluation.html", help="the HTML report (default: %(default)s)")
    evaluate.add_argument("--json", default=None, help="also write the metrics as JSON here")
    for role in EVALUATE_COLUMNS:
        evaluate.add_argument(f"--{role}-column", default=role, dest=f"{role}_column")
    evaluate.add_argument("--batch-size", type=int, default=16, help="rows per batch (default: %(default)s)")
    evaluate.add_argument("--device", default=None, help="e.g. cpu or cuda (default: Inseq's choice)")
    evaluate.add_argument("--draws", type=int, default=1000, help="bootstrap resamples and permutations")
    evaluate.add_argument("--overwrite", action="store_true", help="replace --out / --json if they exist")
    evaluate.add_argument(
        "--target-tokens",
        choices=["first", "whole"],
        default="first",
        help="evidence/cue: explain the first token of a multi-token target (the ALTI-logit paper's convention), or "
        "every token (scores summed)",
    )
    evaluate.add_argument("--option", action="append", default=[], metavar="METHOD:KEY=VALUE", help="a method option")
    explore = commands.add_parser("explore", help="write the interactive explorer page: methods side by side, layer "
                                  "by layer, with the contribution graph of the clicked entry")  # fmt: skip
    explore.add_argument("input", nargs="?", default=None,
                         help="the text or prompt (generation and encoder models), or an image or audio file path "
                         "(vision and speech models)")  # fmt: skip
    explore.add_argument("--model", default=None, help=MODEL_HELP)
    explore.add_argument("--processor", default=None, help=PROCESSOR_HELP)
    explore.add_argument("--target", default=None,
                         help="target text, label or transcript (default: the model's own; decoder-only models: the "
                         "whole text)")  # fmt: skip
    explore.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="methods side by side (default: alti with per_head=true, value_zeroing with per_layer=true, alti_logit)",
    )
    explore.add_argument("--option", action="append", default=[], metavar="METHOD:KEY=VALUE", help="a method option")
    explore.add_argument(
        "--threshold",
        type=float,
        default=0.04,
        help="contribution graphs: keep edges above this importance (default: %(default)s)",
    )
    explore.add_argument("--no-graphs", action="store_true", help="leave out the contribution graphs")
    explore.add_argument(
        "--saved",
        nargs="+",
        default=None,
        metavar="JSON",
        help="instead of a model: outputs saved with out.save(), shown side by side",
    )
    explore.add_argument("--device", default=None, help="e.g. cpu or cuda (default: Inseq's choice)")
    explore.add_argument("--out", default="explorer.html", help="the HTML page (default: %(default)s)")
    explore.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    demo_data = commands.add_parser("demo-data", help="export the demo grammar's annotated data for every protocol")
    demo_data.add_argument("out", help="folder to write the files into")
    demo_data.add_argument("--count", type=int, default=40, help="sentence pairs to draw")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; output cut short by a closed pipe (``inseq-mixing methods | head``) ends quietly."""
    try:
        return run_command(argv)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout at exit: send that flush nowhere
        return 0


def run_command(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["attribute"]:  # Inseq's own parser reads the rest
        return run_inseq_attribute(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "methods":  # answered from the declarations: no torch, no Inseq
        if args.options:
            print(method_options_text())
            return 0
        for name, line in list_methods():
            print(f"{name:34} {line}")
        return 0
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    for message in SHOWN_WARNINGS:
        warnings.filterwarnings("once", message=message)
    warnings.showwarning = lambda message, *args, **kwargs: print(f"note: {message}", file=sys.stderr)
    logging.disable(logging.WARNING)
    hf_logging.disable_progress_bar()  # loading bars would bury one-line errors; the commands show their own
    if args.command == "demo":
        return run_demo(args)
    if args.command == "attribute-dataset":
        return run_attribute_dataset(args)
    if args.command == "evaluate":
        return run_evaluate(args)
    if args.command == "demo-data":
        return run_demo_data(args)
    if args.command == "explore":
        return run_explore(args)
    return run_compare(args)


if __name__ == "__main__":
    sys.exit(main())
