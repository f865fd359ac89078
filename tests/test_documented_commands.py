"""Every `accelbench` command the project shows (README.md and docs/ code blocks and inline code, the header comments
of suites and sweep specs) runs, so a documented command cannot rot: those that would train or sample at scale as a
dry run (`--dry-run`; a sweep: its spec loaded and planned), the rest as written on a scratch store. A synopsis
(`[--opt X]`, `...`, or a placeholder such as FILE or URL) cannot run: each option it names must exist."""
from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest

from cli import build_parser, main
from sweeps.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True))]
HEADERS = sorted(glob.glob("suites/**/*.yaml", root_dir=ROOT, recursive=True) +
                 glob.glob("sweeps/specs/*.yaml", root_dir=ROOT))
PLANNED = ("run", "suite", "lambada")  # at scale: a dry run plans every trial, its files, passes and cost
AS_WRITTEN = ("list", "doctor", "report")  # cheap: run on a scratch store and cache
SERVERS = ("ui", "dashboard", "worker", "studies")  # start a server or join a study: parsed here, run in
# tests/test_cli.py (ui) and tests/test_sweeps.py (worker, studies, dashboard)
PLACEHOLDER = re.compile(r"\b(FILE|SPEC|URL|URI|NAME|N|K|DBHOST|TRACKHOST)\b")


def _fenced(text: str) -> list[str]:
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S)
             for line in block.replace("\\\n", " ").splitlines()]
    return [line.split("  #")[0].strip() for line in lines if line.strip().startswith("accelbench")]


def _inline(text: str) -> list[str]:
    return [" ".join(span.split()) for span in re.findall(r"`(accelbench [^`]+)`", text)]


def _header(text: str) -> list[str]:
    """`#   accelbench ...` in a file's leading comment, with its deeper-indented continuation lines."""
    commands: list[list[str]] = []
    current = None
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line[1:]
        if body.strip().startswith("accelbench "):
            current = [body.strip()]
            commands.append(current)
        elif current is not None and body.startswith("     "):
            current.append(body.strip())
        else:
            current = None
    return [" ".join(c).replace("\\ ", "") for c in commands]


def documented() -> list[tuple[str, str]]:
    found = [(f, c) for f in DOCS for c in (_fenced((ROOT / f).read_text()) + _inline((ROOT / f).read_text()))]
    found += [(f, c) for f in HEADERS for c in _header((ROOT / f).read_text())]
    # a bare subcommand named in prose ("`accelbench suite` resumes ...") is a mention, not a command
    return [(f, c) for f, c in found if len(c.split()) > 2 or c.split()[1] in AS_WRITTEN + SERVERS]


COMMANDS = sorted(set(documented()))


def test_the_docs_show_commands_of_every_kind():
    kinds = {c.split()[1] for _, c in COMMANDS}
    assert {"run", "suite", "lambada", "sweep", "report", "doctor", "list", "ui"} <= kinds
    assert len({f for f, _ in COMMANDS if f.startswith("suites/papers/")}) == len(
        glob.glob("suites/papers/*.yaml", root_dir=ROOT))  # every paper suite says how to run it


def _subparser(command: str):
    """The parser of the command's subcommand and its name (`accelbench --debug ...`: the top parser, None)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    name = next(w for w in shlex.split(command)[1:] if not w.startswith("-"))
    return (sub.choices[name], name) if name in sub.choices else (parser, None)


def _checkpoints(command: str, folder: Path) -> str:
    """DIR and `<folder with ...>` stand for the checkpoints folder: an empty one here (the dry run lists the
    files it would read)."""
    return re.sub(r"<[^<>]*(<[^<>]*>[^<>]*)*>", str(folder), command).replace(" DIR", f" {folder}")


@pytest.mark.parametrize("source,command", COMMANDS, ids=[f"{f}:{c[:60]}" for f, c in COMMANDS])
def test_a_documented_command_runs(source, command, tmp_path, monkeypatch, capsys, request):
    monkeypatch.chdir(ROOT)
    command = _checkpoints(command, tmp_path / "checkpoints")
    parser, name = _subparser(command)
    if "[" in command or "..." in command or PLACEHOLDER.search(command):
        options = {o for a in parser._actions for o in a.option_strings}
        named = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command))
        assert named <= options, f"{source}: {command!r} names options {sorted(named - options)} it lacks"
        return
    argv = shlex.split(command)[1:]
    if "trial.yaml" in argv:  # the trial file is the first YAML block of the page that shows the command
        block = re.search(r"```yaml\n(.*?)```", (ROOT / source).read_text(), re.S).group(1)
        (tmp_path / "trial.yaml").write_text(block)
        argv[argv.index("trial.yaml")] = str(tmp_path / "trial.yaml")
    store = ["--tracking-uri", request.getfixturevalue("fresh_store")]
    if name in PLANNED:
        code = main([*argv, *([] if "--dry-run" in argv else ["--dry-run"])])  # with --cost too: the plan
    elif name in AS_WRITTEN:
        if name == "report":  # a report needs runs: one trial of the table teacher in the named experiment
            request.getfixturevalue("plugin")
            experiment = argv[argv.index("--experiment") + 1]
            assert main(["run", "--teacher", "table-ar", "--method", "ar", "--n-samples", "2", "--experiment",
                         experiment, *store, "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0
        extra = {"list": [], "doctor": [*store, "--cache-dir", str(tmp_path / "cache")],
                 "report": [*store, "--out", str(tmp_path / "report")]}[name]
        code = main([*argv, *extra])
    elif name == "sweep":
        args = parser.parse_args(argv[1:])
        assert load_spec(args.spec, checkpoints=tmp_path / "checkpoints").study
        return
    else:
        assert name in SERVERS + ("zoo",), f"{source}: {command!r}: a kind of command this test does not know"
        parser.parse_args(argv[1:])  # zoo build trains the whole zoo: tests/test_zoo.py builds it on a tiny suite
        return
    err = capsys.readouterr().err
    assert code == 0, f"{source}: {command!r} exited {code}: {err[-500:]}"
