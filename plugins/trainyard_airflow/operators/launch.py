"""A parse-time-light front for the Kubernetes training operators.

Importing the cncf.kubernetes provider (and the kubernetes client) costs ~0.9 s, which every DAG parse
would pay. This operator imports nothing heavy: ``execute`` builds the real operator
(``trainyard_airflow.operators.training``: a Pod for one node, an Indexed Job and its Service for more)
and hands every entry point on to it, so the provider's own code creates, waits and cleans up:

- ``execute``: create, then defer to the trigger (the worker slot is free while the pods run);
- ``execute_complete`` / ``trigger_reentry``: where the provider's Job / Pod operator resumes;
- ``on_kill`` (task timeout, "mark failed" while running here) and any exception, ``AirflowTaskTimeout``
  (a ``BaseException``) included: delete what ``execute`` created;
- ``resume_execution`` with ``__fail__`` (the deferral timed out, or the trigger failed): the same.

A kill while deferred reaches the trigger's ``on_kill`` instead, which deletes the Pod or the Job.

Pools: the task keeps its ``pool_slots`` (the job's GPUs) while deferred only if its pool counts
deferred tasks (``include_deferred``); the GPU pools made from resources.yaml do
(``trainyard.scheduling.resources.pools``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from trainyard_airflow.errors import fail_permanently


class KubernetesTrainingLauncher(BaseOperator):
    """Train a JobSpec on Kubernetes, deferred. ``config_path`` is the run config on this worker."""

    template_fields: Sequence[str] = ("spec", "run_key", "config_path")

    def __init__(
        self,
        *,
        spec: Any,
        run_key: str,
        config_path: Any,
        kubernetes_conn_id: str = "kubernetes_default",
        deferrable: bool = True,
        poll_interval: float = 30,
        pipeline_team: str | None = None,
        **kwargs,
    ) -> None:
        """``pipeline_team``: the team whose own DAG this is (None: the one DAG of every team), whose job
        ``spec`` must be (it comes from an XCom, which users may write)."""
        super().__init__(**kwargs)
        self.spec, self.run_key, self.config_path = spec, run_key, config_path
        self.pipeline_team = pipeline_team
        self.kubernetes_conn_id = kubernetes_conn_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self._inner: Any = None

    def operator(self) -> Any:
        """The provider-based operator that does the work (built at run time, where its import belongs)."""
        from trainyard.spec import parse_spec
        from trainyard.teams import check_pipeline_team
        from trainyard_airflow.operators.training import training_operator

        if self._inner is None:
            check_pipeline_team(parse_spec(self.spec).resources.team, self.pipeline_team)
            self._inner = training_operator(
                task_id=self.task_id,
                spec=self.spec,
                run_key=self.run_key,
                config_path=self.config_path,
                kubernetes_conn_id=self.kubernetes_conn_id,
                deferrable=self.deferrable,
                poll_interval=self.poll_interval,
            )
        return self._inner

    # A permanent trainyard error (a retry that finds resources.max_hours used up by the try the cluster
    # stopped at its deadline: MaxHoursReached) fails the task at once, as in every task of the DAGs.
    def execute(self, context):
        self._check_job(context)
        return fail_permanently(self.operator().execute)(context)

    def execute_complete(self, context, event, **kwargs):
        self._check_job(context)
        return fail_permanently(self.operator().execute_complete)(context, event, **kwargs)

    def trigger_reentry(self, context, event):
        self._check_job(context)
        return fail_permanently(self.operator().trigger_reentry)(context, event)

    def _check_job(self, context: Any) -> None:
        """``spec`` is validate_spec's XCom, rendered again at every resume, and a user may write XComs: it
        must still be the job the run's params name (another job's name is another job's run directory,
        files and MLflow runs)."""
        from trainyard.spec import parse_spec
        from trainyard.teams import NotAllowed

        named = (context.get("params") or {}).get("name")
        spec_name = parse_spec(self.spec).name
        if spec_name != named:
            raise NotAllowed(
                f"the spec this task was handed names job {spec_name!r}, but the run is of job {named!r}: "
                "validate_spec's result was changed; trigger the job again"
            )

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context):
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except BaseException:
            if next_method == "__fail__":  # no resume method of the operator ran, so nothing cleaned up
                self.operator().abort(context)
            raise

    def on_kill(self) -> None:
        if self._inner is not None:  # nothing was created before execute built the operator
            self._inner.on_kill()
