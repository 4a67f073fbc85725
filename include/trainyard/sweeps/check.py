"""What a sweep section must be, beyond its own fields: checked by ``validate_spec`` (the run's first task,
``trainyard validate``), where the recipe and the team are known. Every problem is named by its field."""

from __future__ import annotations

from trainyard.errors import spec_error_message
from trainyard.scheduling.resources import ResourcesConfig, max_reach
from trainyard.spec import JobSpec, SpecError

# What a trial's result holds besides the recipe's val metrics, for constraints
RESULT_METRICS = ("samples_per_second", "train_seconds", "loop_seconds")


def check_sweep(spec: JobSpec, fleet: ResourcesConfig) -> None:
    """SpecError naming every problem of ``spec.sweep`` (none: nothing to check)."""
    from trainyard import recipes
    from trainyard.sweeps.study import with_values

    sweep = spec.sweep
    if sweep is None:
        return
    problems = []
    if spec.backends.launcher != "local":
        problems.append("sweep: the trials of a sweep train with backends.launcher 'local'")
    if problems:
        raise SpecError(spec_error_message(problems))
    if spec.recipe == "custom":
        # the program's metrics are its own: the objective is whatever it reports (trainyard.training.custom)
        known = None
        if sweep.objective == "step":
            problems.append("sweep.objective: 'step' numbers a metrics line; name a metric the program reports")
        for i, p in enumerate(sweep.parameters):
            if p.field[0] != "hyperparameters":
                problems.append(
                    f"sweep.parameters[{i}].name: a custom program takes no recipe_options; sweep "
                    "hyperparameters.* (it reads them from TRAINYARD_HYPERPARAMETERS)"
                )
        if problems:
            raise SpecError(spec_error_message(problems))
    else:
        recipe = recipes.get(spec.recipe)
        known = sorted(f"val_{m}" for m in recipe.epoch_metrics)  # what a trial reports after every epoch
    if known is not None and sweep.objective not in known:
        problems.append(
            f"sweep.objective: recipe {spec.recipe!r} reports no {sweep.objective!r} after each epoch; one of "
            f"{known} (the metrics of its evaluation, such as BLEU, come once, after the training)"
        )
    for i, c in enumerate(sweep.constraints):
        if known is not None and c.metric not in (*known, *RESULT_METRICS):
            problems.append(
                f"sweep.constraints[{i}].metric: a trial's result has no {c.metric!r}; one of "
                f"{[*known, *RESULT_METRICS]}"
            )
    for i, p in enumerate(sweep.parameters):
        # each end of the range, each choice, and a float range's inside (a whole-number field swept as
        # float fails there, not at its ends) must make a valid job
        inside = () if p.type != "float" else (p.low + (p.high - p.low) * 0.377,)  # type: ignore[operator]
        for value in (*p.bounds(), *inside):
            try:
                recipes.check_spec(with_values(spec, {p.name: value}))
            except SpecError as err:
                why = "; ".join(line.strip() for line in str(err).splitlines()[1:])
                problems.append(f"sweep.parameters[{i}] ({p.name} = {value!r}): {why}")
                break
    res = spec.resources
    most = max_reach(fleet, res.team, res.slot_type)
    if sweep.parallelism * res.total_gpus > most:
        problems.append(
            f"sweep.parallelism: {sweep.parallelism} trials x {res.total_gpus} GPU(s) need "
            f"{sweep.parallelism * res.total_gpus} {res.slot_type} slots at once; team {res.team} may hold at most "
            f"{most} (its quota and what others lend it, within its borrowing limit): lower the parallelism to "
            f"{max(most // res.total_gpus, 1)}"
        )
    if problems:
        raise SpecError(spec_error_message(problems))
