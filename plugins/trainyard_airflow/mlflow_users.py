"""Tell the tracking server's auth app (:mod:`trainyard.tracking.mlflow_auth`) who Airflow's users are and
which teams ``resources.yaml`` lists them in: ``python -m trainyard_airflow.mlflow_users`` with ``plugins/`` on
the path and the profile's environment (the cluster profile runs it at every ``up``; run it after an edit
of a team's ``members``). Prints each user's teams as MLflow now has them."""

from __future__ import annotations

import json


def main() -> int:
    from trainyard.scheduling.resources import resources_in_force
    from trainyard.teams import teams_of
    from trainyard.tracking import mlflow_auth
    from trainyard.tracking.mlflow_tracking import client
    from trainyard_airflow.auth import logins

    if not mlflow_auth.enabled():
        raise SystemExit("the tracking store is no MLflow server this process logs into (MLFLOW_TRACKING_USERNAME)")
    config, users = resources_in_force(), logins()
    done = mlflow_auth.sync(client(), sorted(config.teams), {user: teams_of(config, user) for user in users}, users)
    print(json.dumps(done, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
