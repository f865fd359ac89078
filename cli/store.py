"""`accelbench report`, `ui`, `doctor` and `list`: what reads (or mends) the store and the registries."""
from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from cli import options
from cli.serve import check_port_free, serve

LIST_WIDTH = 120  # `accelbench list` wraps at a word break within this many columns


def cmd_report(args) -> int:
    from bench.tracking import tracking_uri
    from reports.report import write_report

    path = write_report(tracking_uri(args.tracking_uri), args.experiment, options.report_dir(args, args.experiment),
                        args.filter or "", args.tolerance)
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


# The saved views `accelbench ui` opens on (bench.tracking.save_view), and the width in pixels of a column of each
# kind in them: a run's whole name, and a metric's 17 significant digits instead of MLflow's `4.94918490…`.
TABLE_VIEW, COMPARE_VIEW = "accelbench-runs", "accelbench-compare"
WIDTHS = {"attributes": 280, "params": 110, "metrics": 150}


def headline_metrics(runs) -> list[str]:
    """The speed-ups, the headline quality metrics of `runs` by name, then the reference arm's: on a narrow screen
    the method's own numbers show first."""
    from core.names import SPEEDUP_STEPS, SPEEDUP_WALL
    from reports.tables import headline_of

    quality = sorted({h[0] for r in runs if (h := headline_of([r.data.tags]))})
    return [SPEEDUP_WALL, SPEEDUP_STEPS, *quality, *(f"ref/{q}" for q in quality)]


def table_state(metrics: list[str]) -> dict:
    """A runs table whose columns are the method, the teacher and `metrics`, in that order, wide enough to read."""
    from bench.tracking import column

    shown = [column("params", "method"), column("params", "teacher"), *(column("metrics", k) for k in metrics)]
    widths = {column("attributes", "Run Name"): WIDTHS["attributes"], **{c: WIDTHS[c.split(".")[0]] for c in shown}}
    return {"selectedColumns": shown, "columnOrder": list(widths), "columnWidths": widths}


def compare_state(runs) -> dict:
    """The runs page on `runs` alone: the table of `table_state`, and as charts a bar chart of each headline metric
    (its runs side by side, values printed) above a table of every knob and metric in which they differ."""
    metrics = headline_metrics(runs)
    charts = [{"uuid": f"accelbench-{k}", "type": "BAR", "metricKey": k, "displayName": k, "runsCountToCompare": 10,
               "metricSectionId": "accelbench-headline", "deleted": False, "isGenerated": False} for k in metrics]
    charts.append({"uuid": "accelbench-differences", "type": "DIFFERENCE", "chartName": "What differs",
                   "compareGroups": ["Parameters", "Model metrics"], "showDifferencesOnly": True,
                   "showChangeFromBaseline": False, "baselineColumnUuid": "", "runsCountToCompare": 10,
                   "metricSectionId": "accelbench-differences", "deleted": False, "isGenerated": False})
    sections = [{"uuid": "accelbench-headline", "name": "Headline numbers", "display": True, "isReordered": False,
                 "columns": min(len(metrics), 4)},
                {"uuid": "accelbench-differences", "name": "Every knob and metric that differs", "display": True,
                 "isReordered": False, "columns": 1, "cardHeight": 640}]
    ids = ", ".join(f"'{r.info.run_id}'" for r in runs)
    # the sections in this order, MLflow's own charts of every other metric after them
    return {**table_state(metrics), "searchFilter": f"attributes.run_id IN ({ids})", "compareRunCharts": charts,
            "compareRunSections": sections, "isAccordionReordered": True}


def newest_pair(runs) -> list:
    """The newest two finished runs (of `runs`, newest first) on one teacher, whose quality metrics compare; [] if
    none."""
    seen = {}
    for r in (r for r in runs if r.info.status == "FINISHED"):
        teacher = r.data.params.get("teacher")
        if teacher in seen:
            return [seen[teacher], r]
        seen[teacher] = r
    return []


def ui_views(uri: str, base: str, pair: list[str] | None = None) -> list[str]:
    """Save the two views of each AccelBench experiment with trials, and return the lines that give their URLs: its
    runs table with the method, the teacher, the speed-ups and the headline quality of both arms as columns, and the
    comparison (`compare_state`) of two runs: `pair` (run ids) in its experiment, `newest_pair` in the others. An
    experiment without trials (trainings), or in a store that cannot be written, gets its plain runs table."""
    from mlflow.exceptions import MlflowException

    from bench.tracking import accelbench_experiments, runs_page_url, save_view, sqlite_file, unwritable
    from core.errors import UserError
    from core.names import KIND_TAG, TRIAL

    c, experiments = accelbench_experiments(uri)
    db = sqlite_file(uri)
    fault = unwritable(db) if db is not None else None  # the UI reads a read-only store, without saved views
    try:
        chosen = [c.get_run(run_id) for run_id in pair or ()]
    except MlflowException as exc:
        raise UserError(f"--compare: {exc.message} in {uri}") from None
    if chosen and chosen[0].info.experiment_id != chosen[1].info.experiment_id:
        raise UserError("--compare: the two runs are in different experiments; MLflow's runs page shows one")
    lines = [f"  no saved views: {fault}"] if fault else []
    for e in experiments:
        # MLflow's first page of trials: the newest 1000
        trials = [] if fault else c.search_runs([e.experiment_id], f"tags.`{KIND_TAG}` = '{TRIAL}'",
                                                order_by=["attributes.start_time DESC"])
        if not trials:
            lines.append(f"  {e.name}, runs table: {runs_page_url(base, e.experiment_id)}")
            continue
        save_view(c, e.experiment_id, TABLE_VIEW, "AccelBench: headline columns",
                  table_state(headline_metrics(trials)))
        lines.append(f"  {e.name}, runs table: {runs_page_url(base, e.experiment_id, TABLE_VIEW)}")
        two = chosen if chosen and chosen[0].info.experiment_id == e.experiment_id else newest_pair(trials)
        if two:
            save_view(c, e.experiment_id, COMPARE_VIEW, "AccelBench: two runs compared", compare_state(two))
            names = " with ".join(f'"{r.info.run_name}"' for r in two)
            lines.append(f"  {e.name}, compare {names}: "
                         f"{runs_page_url(base, e.experiment_id, COMPARE_VIEW, charts=True)}")
    return lines


def cmd_ui(args) -> int:
    from bench.tracking import tracking_uri

    uri = tracking_uri(args.tracking_uri)
    base = f"http://{args.host}:{args.port}"
    check_port_free(args.host, args.port)  # before the views are written: a taken port does nothing
    lines = ui_views(uri, base, args.compare)
    # One worker and no job runner: the UI starts in ~20 s instead of ~70 s on 2 cores.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
           "--port", str(args.port), "--workers", "1"]
    print(f"MLflow UI on {base} for {uri} (Ctrl-C to stop); each experiment's runs table and a comparison of two runs "
          f"(pick them with --compare RUN_ID RUN_ID):", *lines, sep="\n", flush=True)  # before the server's lines
    return serve(cmd, env, args.host, args.port, "the MLflow UI")


def register(sub) -> None:
    rp = sub.add_parser("report", help="write REPORT.md and plots from an MLflow experiment")
    options.store(rp, experiment=True)
    rp.add_argument("--filter", help="extra MLflow search filter, e.g. \"params.teacher = 'digits-ar-t2i'\"")
    rp.add_argument("--out", help="report directory (default results/<experiment>)")
    rp.add_argument("--tolerance", type=float, help="LEADERBOARD.md: the quality drift (the headline metric's units) "
                    "within which settings rank by wall speed-up (default: twice the teacher arm's std over seeds)")
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
    ui.add_argument("--compare", nargs=2, metavar="RUN_ID",
                    help="the two runs (of one experiment) its comparison URL shows; default each experiment's "
                         "newest two finished trials on one teacher")
    ui.set_defaults(func=cmd_ui)
