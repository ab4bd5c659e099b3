"""Compare methods on the embedded demo model: faithfulness, agreement, alignment accuracy, report and tables.

python examples/compare_methods.py [--out out/compare]
"""

import argparse
from pathlib import Path

import inseq_mixing
from inseq_mixing.demo import demo_examples, load_demo_model
from inseq_mixing.views.demo import alignment_accuracy
from inseq_mixing.views.report import write_report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out/compare")
    parser.add_argument("--methods", nargs="+", default=["alti_logit", "decompx", "value_zeroing", "deeplift"])
    args = parser.parse_args()

    model, tokenizer = load_demo_model()
    examples = demo_examples(count=4)
    result = inseq_mixing.compare(
        model,
        args.methods,
        [" ".join(e.source) for e in examples],
        [" ".join(e.target) for e in examples],
        tokenizer=tokenizer,
    )
    for row in result.summary():
        accuracy = alignment_accuracy(result.outputs[row["method"]], examples)
        print(
            f"{row['method']:>14}: comprehensiveness {row['comprehensiveness_prob']:.3f} "
            f"(random {row['random_comprehensiveness_prob']:.3f}), sufficiency {row['sufficiency_prob']:.3f} "
            f"(random {row['random_sufficiency_prob']:.3f}), alignment accuracy {accuracy:.3f}"
        )
    out = Path(args.out)
    print("written:", result.to_csv(out / "tokens.csv"), result.to_json(out / "comparison.json"))
    print("written:", write_report(result, out / "report.html"))


if __name__ == "__main__":
    main()
