"""`accelbench report`: REPORT.md and PNG plots made from an MLflow experiment's finished trial runs, nothing else."""
from __future__ import annotations

from pathlib import Path

from bench.errors import UserError
from reports.plots import acceptance_vs_window, quality_vs_time
from reports.tables import TrialRun, build_markdown


def load_runs(uri: str, experiment: str, filter_string: str = "") -> list[TrialRun]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise UserError(f"no MLflow experiment {experiment!r} in {uri}")
    query = "tags.`accelbench.kind` = 'trial' and attributes.status = 'FINISHED'"
    if filter_string:
        query += f" and {filter_string}"
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], query, max_results=1000, page_token=token)
        runs += [TrialRun.from_mlflow(r) for r in page]
        token = page.token
        if not token:
            return runs


def write_report(uri: str, experiment: str, out: Path, filter_string: str = "") -> Path:
    runs = load_runs(uri, experiment, filter_string)
    out.mkdir(parents=True, exist_ok=True)
    images = []
    for teacher in sorted({r.teacher for r in runs}):
        mine = [r for r in runs if r.teacher == teacher]
        images += [p for p in (quality_vs_time(mine, teacher, out), acceptance_vs_window(mine, teacher, out)) if p]
    text = build_markdown(runs, f"AccelBench report: {experiment}")
    if images:
        text += "\n## Plots\n\n" + "".join(f"![{p.stem}]({p.name})\n" for p in images)
    path = out / "REPORT.md"
    path.write_text(text)
    return path
