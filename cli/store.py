"""`accelbench report`, `ui`, `doctor` and `list`: what reads (or mends) the store and the registries."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from cli import options

LIST_WIDTH = 120  # `accelbench list` wraps at a word break within this many columns


def cmd_report(args) -> int:
    from bench.tracking import tracking_uri
    from reports.report import write_report

    path = write_report(tracking_uri(args.tracking_uri), args.experiment, options.report_dir(args, args.experiment),
                        args.filter or "")
    print(f"report: {path}")
    return 0


def cmd_doctor(args) -> int:
    from bench.doctor import doctor
    from bench.tracking import Tracker, tracking_uri

    uri = tracking_uri(args.tracking_uri)
    lines = doctor(Tracker(uri, options.DEFAULT_EXPERIMENT), options.open_cache(args))
    print("\n".join(lines) if lines else f"nothing to fix in {uri} and the cache")
    return 0


@dataclass(frozen=True)
class Listed:
    """One registry entry as `accelbench list` and the docs' reference page (docs/gen_reference.py) show it."""
    name: str
    text: str  # the kind in brackets or parentheses, then the docstring's first paragraph
    knobs: str = ""  # a method's own knobs with their defaults


def registry_listing(checkpoints: Path | None) -> dict[str, list[Listed]]:
    """Every registered teacher, method and metric by section, from the registries and the docstrings alone. With a
    checkpoints folder, a teacher made of local files says which of them it lacks there."""
    from core.config import config_dict, knobs
    from core.registry import METHODS, METRICS, TEACHERS
    from teachers import teacher_class

    def doc(obj) -> str:
        """The docstring's first paragraph: its first line alone may end mid-sentence where the source wraps."""
        return " ".join((obj.__doc__ or "").strip().split("\n\n")[0].split())

    teachers = []
    for name in TEACHERS.names():
        cls = teacher_class(name, checkpoints or Path("."))
        missing = getattr(cls, "unavailable", lambda: None)() if checkpoints is not None else None
        note = f" (unavailable: {missing})" if missing else ""
        teachers.append(Listed(name, f"[{cls.family}, {cls.modality}] {doc(cls)}{note}"))
    for prefix in TEACHERS.prefixes():  # a family of names: its factory's documentation
        teachers.append(Listed(prefix + "<folder>", doc(TEACHERS.get(prefix + "_"))))
    methods = []
    for name, cls in METHODS.items():
        own = {}
        for family in cls.families:
            config_cls = cls.config_class(family)
            if config_cls is family.SamplingConfig:  # a family's own sampler: its knobs are the sampling settings
                continue
            defaults = config_dict(config_cls())
            own.update({k: defaults[k] for k, (_, group) in knobs(config_cls).items() if group is None})
        methods.append(Listed(name, f"families: {', '.join(str(f) for f in cls.families)}. {doc(cls)}",
                              ", ".join(f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in own.items())))
    metrics = [Listed(name, f"({cls.modality}, {'higher' if cls.higher_is_better else 'lower'} is better) {doc(cls)}")
               for name, cls in METRICS.items()]
    return {"teachers": teachers, "methods": methods, "metrics": metrics}


def cmd_list(args) -> int:
    def entry(name: str, text: str) -> None:
        print(textwrap.fill(text, LIST_WIDTH, initial_indent=f"  {name:<22} ", subsequent_indent=" " * 25,
                            break_long_words=False, break_on_hyphens=False))

    headings = {"methods": "methods (knobs with their defaults; every method also takes its family's sampling "
                           "settings):"}
    for section, entries in registry_listing(args.checkpoints).items():
        print(headings.get(section, f"{section}:"))
        for e in entries:
            entry(e.name, e.text)
            if e.knobs:
                entry("", f"knobs: {e.knobs}")
    return 0


def cmd_ui(args) -> int:
    from bench.tracking import runs_table_urls, tracking_uri

    uri = tracking_uri(args.tracking_uri)
    base = f"http://{args.host}:{args.port}"
    # One worker and no job runner: the UI starts in ~20 s instead of ~70 s on 2 cores.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
           "--port", str(args.port), "--workers", "1"]
    print(f"MLflow UI on {base} for {uri} (Ctrl-C to stop); the runs table of each experiment:")
    for name, url in runs_table_urls(uri, base):
        print(f"  {name}: {url}")
    return subprocess.call(cmd, env=env)


def register(sub) -> None:
    rp = sub.add_parser("report", help="write REPORT.md and plots from an MLflow experiment")
    options.store(rp, experiment=True)
    rp.add_argument("--filter", help="extra MLflow search filter, e.g. \"params.teacher = 'digits-ar-t2i'\"")
    rp.add_argument("--out", help="report directory (default results/<experiment>)")
    rp.set_defaults(func=cmd_report)

    dr = sub.add_parser("doctor", help="mark RUNNING runs whose process is gone KILLED; clean the cache of what "
                                       "killed builds left")
    options.store(dr)
    options.cache(dr)
    dr.set_defaults(func=cmd_doctor)

    ls = sub.add_parser("list", help="list registered teachers, methods and metrics")
    options.checkpoints(ls)
    ls.set_defaults(func=cmd_list)

    ui = sub.add_parser("ui", help="start the MLflow UI on the tracking store")
    options.store(ui)
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=cmd_ui)
