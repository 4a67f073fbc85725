"""A sweep's summary in MLflow: one run per sweep run (tagged ``sweep.summary``) with the best trial's
values and objective, each parameter's importance, every trial of the study as a CSV, and a
parallel-coordinates PNG of the trials (values against the objective)."""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.spec import JobSpec, safe_key

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)


def importances(study: optuna.Study) -> dict[str, float]:
    """Each parameter's share of the objective's variance over the finished trials (fANOVA); empty with
    fewer than two finished trials or one parameter that never varied."""
    import optuna

    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
    except (ValueError, RuntimeError) as err:
        log.info("parameter importances not computed: %s", err)
        return {}


def parallel_coordinates_png(study: optuna.Study, path: Path) -> bool:
    """The trials' values against the objective as a PNG; False when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = optuna.visualization.matplotlib.plot_parallel_coordinate(study)
    fig = ax.get_figure(root=True)
    assert fig is not None
    fig.set_size_inches(10, 5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_hparams(tensorboard_dir: str, values: dict, objective: str, state: str) -> None:
    """The trial's values in its own TensorBoard run directory, where its scalars are: TensorBoard's HParams
    view then lists the trial with its curves (torch's ``add_hparams`` would write a run of its own,
    unlinked from them). The metric column is the objective's scalar of that run."""
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    plain = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in values.items()}
    experiment, start, end = hparams({**plain, "trial_state": state}, {objective: float("nan")})
    writer = SummaryWriter(tensorboard_dir)
    try:
        file_writer = writer._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)
    finally:
        writer.close()


def log_summary(spec: JobSpec, study: optuna.Study, sweep_run: str, best: optuna.trial.FrozenTrial | None) -> str:
    """The summary run of ``sweep_run`` (created once, updated by a retry); its MLflow run id."""
    from trainyard.tracking import mlflow_tracking as mt

    assert spec.sweep is not None
    c = mt.client()
    run_id = mt.ensure_run(
        c,
        experiment=spec.name,
        run_key=f"{sweep_run}/summary",
        run_name=f"sweep-{spec.sweep.name}-{safe_key(sweep_run)}"[:250],
        team=spec.resources.team,
        tags={
            "sweep.name": spec.sweep.name,
            "sweep.run": sweep_run,
            "sweep.summary": "true",
            "sweep.objective": f"{spec.sweep.direction} {spec.sweep.objective}",
            "sweep.sampler": spec.sweep.sampler,
            "sweep.pruner": spec.sweep.pruner,
        },
    )
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    metrics = {f"trials_{state}": float(n) for state, n in counts.items()}
    if best is not None and best.value is not None:
        metrics[f"best_{spec.sweep.objective}"] = float(best.value)
        c.set_tag(run_id, "sweep.best_trial", str(best.number))
        for name, value in best.params.items():
            c.log_param(run_id, f"best.{name}", value)
    for name, share in importances(study).items():
        metrics[f"importance.{name}"] = share
    for name, value in metrics.items():
        c.log_metric(run_id, name, value)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        study.trials_dataframe().to_csv(folder / "trials.csv", index=False)
        parallel_coordinates_png(study, folder / "parallel_coordinates.png")
        c.log_artifacts(run_id, str(folder), "sweep")
    return run_id
