"""MkDocs hooks of the guide (``mkdocs.yml``): every method page gets, from the method's declaration, its one-line
summary and description (the paper, the definition, the outputs, what is our extension) at the top and the table of
its options (name, default, accepted values, documentation) at the end, so the pages list exactly the options the code
takes. A method page without a declaration, or a declaration without a page, fails the build."""

from pathlib import Path

from inseq_mixing.declarations import DECLARATIONS


def on_files(files, config):
    sources = [f.src_uri for f in files if f.src_uri.startswith("methods/") and f.src_uri != "methods/index.md"]
    pages = {Path(source).stem for source in sources}
    missing, unknown = sorted(set(DECLARATIONS) - pages), sorted(pages - set(DECLARATIONS))
    if missing or unknown:
        raise ValueError(f"Method pages: missing for {missing}, without a method: {unknown} (docs/methods/NAME.md).")
    return files


def options_table(declaration) -> str:
    rows = ["| option | default | accepted | what it does |", "|---|---|---|---|"]
    for field in declaration.option_fields():
        default = field.default
        choices = field.metadata.get("choices")
        accepted = ", ".join(f"`{choice!r}`" for choice in choices) if choices else field.type.__name__ \
            if isinstance(field.type, type) else str(field.type)  # fmt: skip
        doc = field.metadata.get("doc", "").replace("|", "\\|")
        rows.append(f"| `{field.name}` | `{default!r}` | {accepted} | {doc} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    source = page.file.src_uri
    if not source.startswith("methods/") or source == "methods/index.md":
        return markdown
    declaration = DECLARATIONS[Path(source).stem]
    title, _, rest = markdown.partition("\n")
    header = f"{title}\n\n**{declaration.summary}**\n\n{declaration.description}\n"
    options = "\n\n## Options\n\nPassed to `model.attribute(...)` (or `--option` on the command line).\n\n"
    return header + rest + options + options_table(declaration) + "\n"
