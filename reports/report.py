"""`accelbench report`: REPORT.md and PNG plots made from an MLflow experiment's finished trial runs (and lm-eval
runs, `accelbench lambada`), nothing else."""
from __future__ import annotations

from pathlib import Path

from core.errors import UserError
from core.names import COST, KIND_TAG, LAMBADA, STUDY, TRIAL
from reports.leaderboard import leaderboard_markdown, leaderboard_sections
from reports.plots import (acceptance_by_position, acceptance_vs_window, quality_vs_time, study_history,
                           study_importances)
from reports.tables import TrialRun, build_markdown, report_order


def load_runs(uri: str, experiment: str, filter_string: str = "", kind: str = TRIAL) -> list[TrialRun]:
    """The experiment's finished runs of `kind` (trials; `lambada`: lm-eval runs) that match `filter_string`."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.search_utils import SearchUtils

    from bench.tracking import client as store_client

    try:  # MLflow's own parser, before the store is touched
        SearchUtils.parse_search_filter(filter_string)
    except MlflowException as exc:
        raise UserError(f"--filter {filter_string!r}: {exc.message}") from None
    client = store_client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments() if e.name != "Default")
        raise UserError(f"no MLflow experiment {experiment!r} in {uri}; it has: {', '.join(names) or '(none)'} "
                        f"(--experiment NAME)")
    query = f"tags.`{KIND_TAG}` = '{kind}' and attributes.status = 'FINISHED'"
    if filter_string:
        query += f" and {filter_string}"
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], query, max_results=1000, page_token=token)
        runs += [TrialRun.from_mlflow(r) for r in page]
        token = page.token
        if not token:
            return runs


def _studies(uri: str, experiment: str) -> list[tuple[str, dict]]:
    """(study name, parent-run params) of every sweep logged in the experiment."""
    from bench.tracking import client as store_client

    client = store_client(uri)
    exp = client.get_experiment_by_name(experiment)
    parents = client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = '{STUDY}'", max_results=1000)
    return sorted((r.data.tags["study_name"], dict(r.data.params)) for r in parents if "objectives" in r.data.params)


def study_plots(name: str, params: dict, runs: list[TrialRun], out: Path) -> list[Path]:
    """History and knob importances of a study, rebuilt from its child runs (mean over seeds per trial)."""
    import optuna

    metric, direction = params["objectives"].split(",")[0].split(":")
    space = params["space"].split(",")
    by_number: dict[int, list[TrialRun]] = {}
    for r in runs:
        if r.tags.get("study_name") == name and r.tags.get("optuna_state") == "COMPLETE" and metric in r.metrics:
            by_number.setdefault(int(r.tags["optuna_trial_number"]), []).append(r)
    values = {n: sum(r.metrics[metric] for r in rs) / len(rs) for n, rs in by_number.items()}
    if not values:
        return []
    paths = [study_history(name, metric, direction, values, out)]
    choices = {k: sorted({rs[0].knobs[k] for rs in by_number.values()}) for k in space}
    if len(values) >= 2 and any(len(c) > 1 for c in choices.values()):
        dists = {k: optuna.distributions.CategoricalDistribution(c) for k, c in choices.items()}
        study = optuna.create_study(direction=direction)
        for n in sorted(by_number):
            study.add_trial(optuna.trial.create_trial(
                params={k: by_number[n][0].knobs[k] for k in space}, distributions=dists, value=values[n]))
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)  # seeded: the same store, the same plot
        paths.append(study_importances(name, metric, optuna.importance.get_param_importances(
            study, evaluator=evaluator), out))
    return paths


def write_cost_report(uri: str, experiment: str, out: Path) -> Path:
    """COST.md from the experiment's cost runs (`accelbench suite FILE --cost`)."""
    from reports.cost import cost_markdown

    out.mkdir(parents=True, exist_ok=True)
    path = out / "COST.md"
    path.write_text(cost_markdown(load_runs(uri, experiment, kind=COST), f"AccelBench cost: {experiment}"))
    return path


def write_report(uri: str, experiment: str, out: Path, filter_string: str = "", tolerance: float | None = None) -> Path:
    """REPORT.md, LEADERBOARD.md (`reports.leaderboard`, the drift `tolerance` in the headline metric's units, or
    its default) and their plots into `out`."""
    runs = load_runs(uri, experiment, filter_string)
    out.mkdir(parents=True, exist_ok=True)
    images = []
    for teacher in sorted({r.teacher for r in runs}):
        mine = [r for r in runs if r.teacher == teacher]
        images += [p for p in (quality_vs_time(mine, teacher, out), acceptance_vs_window(mine, teacher, out),
                               acceptance_by_position(mine, teacher, out)) if p]
    sections = leaderboard_sections(report_order(runs), tolerance, out)
    (out / "LEADERBOARD.md").write_text(leaderboard_markdown(sections, f"AccelBench leaderboard: {experiment}"))
    for name, params in _studies(uri, experiment):
        images += study_plots(name, params, runs, out)
    text = build_markdown(runs, f"AccelBench report: {experiment}", load_runs(uri, experiment, filter_string, LAMBADA))
    if runs:  # every report carries the leaderboards, each teacher's a level below
        text += "\n## Leaderboards (LEADERBOARD.md)\n\n" + "\n".join(
            "#" + line if line.startswith("## ") else line for line in sections)
    if images:
        text += "\n## Plots\n\n" + "".join(f"![{p.stem}]({p.name})\n" for p in images)
    path = out / "REPORT.md"
    path.write_text(text)
    return path
