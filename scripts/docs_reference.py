"""The site's generated pages (mkdocs-gen-files runs this at every `make docs`): `reference/registry.md`, every
registered teacher, method and metric and every family's sampling settings, read from the registries and the code so
that it cannot go stale; and `architecture.md`, the repository's ARCHITECTURE.md as a page of the site."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import mkdocs_gen_files

from cli.store import registry_listing
from core.config import config_dict

ROOT = Path(__file__).resolve().parent.parent
FIELD = re.compile(r"^\s+(\w+)\s*:[^#=]+=[^#]*(?:#\s*(.*))?$")


def cell(text: str) -> str:
    """Text that stays inside one cell of a markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def field_notes(cls: type) -> dict[str, str]:
    """A config dataclass's fields -> the code's own explanation of each: the comment lines just above the field and
    the one at the end of its line."""
    notes, above = {}, []
    for line in inspect.getsource(cls).splitlines():
        m = FIELD.match(line)
        if m:
            notes[m.group(1)] = " ".join([*above, m.group(2) or ""]).strip()
        above = [*above, line.strip()[1:].strip()] if line.strip().startswith("#") else []
    return notes


def sampling_settings(config_cls: type) -> list[tuple[str, object, str]]:
    """(setting, default, what it is) for every field, an embedded config's fields in place of it."""
    defaults, notes, rows = config_dict(config_cls()), field_notes(config_cls), []
    for f in dataclasses.fields(config_cls):
        value = getattr(config_cls(), f.name)
        if dataclasses.is_dataclass(value):
            rows += sampling_settings(type(value))
        else:
            rows.append((f.name, defaults[f.name], notes.get(f.name, "")))
    return rows


def registry_page() -> str:
    import teachers.families

    listing = registry_listing(None)
    out = ["# What is registered", "",
           "Generated from the registries (`core.registry`) and the docstrings at every build of this site; "
           "`accelbench list` prints the same entries, and with `--checkpoints` says which files each real "
           "teacher lacks.", ""]
    for section, title in (("teachers", "Teachers"), ("methods", "Methods"), ("metrics", "Metrics")):
        out += [f"## {title}", ""]
        if section == "methods":
            out += ["| name | what it is | knobs (defaults) |", "|---|---|---|"]
            out += [f"| `{e.name}` | {cell(e.text)} | {cell(e.knobs) or '—'} |" for e in listing[section]]
        else:
            out += ["| name | what it is |", "|---|---|"]
            out += [f"| `{e.name}` | {cell(e.text)} |" for e in listing[section]]
        out.append("")
    out += ["## Sampling settings of each family", "",
            "Every method's config embeds its family's sampling settings, addressed as knobs by their own names "
            "(`--param top_k=50`), and the reference arm (the family's own sampler) samples with exactly those "
            "values.", ""]
    for info in pkgutil.iter_modules(teachers.families.__path__):
        family = importlib.import_module(f"teachers.families.{info.name}").FAMILY
        out += [f"### {family.name}", "", f"The teacher's own sampler is the method `{family.sampler}`.", "",
                "| setting | default | what |", "|---|---|---|"]
        out += [f"| `{k}` | `{v}` | {cell(note)} |" for k, v, note in sampling_settings(family.SamplingConfig)]
        out.append("")
    return "\n".join(out)


with mkdocs_gen_files.open("reference/registry.md", "w") as f:
    f.write(registry_page())
with mkdocs_gen_files.open("architecture.md", "w") as f:
    f.write((ROOT / "ARCHITECTURE.md").read_text())
