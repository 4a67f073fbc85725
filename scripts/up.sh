#!/usr/bin/env bash
# Start Airflow (UI + REST API, scheduler, dag-processor, a triggerer, and one triggerer per team: in
# multi-team mode a team's deferred tasks wait only in its own) and the MLflow UI on localhost; Ctrl-C
# stops them all, as does any of them exiting.
set -euo pipefail
cd "$(dirname "$0")/.."
MLFLOW_PORT=${MLFLOW_PORT:-5000}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
trap 'exit 143' TERM  # a SIGTERM (kill, a service manager's stop) ends the services too, not only Ctrl-C
start() {  # start NAME COMMAND...: in the background, its output in $AIRFLOW_HOME/NAME.log
  local name=$1
  shift
  "$@" >"$AIRFLOW_HOME/$name.log" 2>&1 &
  pids+=($!)
}
# The MLflow UI with MLflow's auth app: each Airflow user logs in with their Airflow password and reads
# only their teams' experiments, runs and models (trainyard.tracking.mlflow_auth). The tasks write the
# SQLite store directly; the service account's sync (below, every minute) tells the server who is in which
# team and grants each team what it made. (No job runner: it serves GenAI features trainyard does not use.)
mkdir -p "$TRAINYARD_HOME/mlflow"
eval "$(python scripts/local_mlflow_auth.py)"  # MLFLOW_AUTH_* for the server, SERVICE_* for the sync
start mlflow-ui env MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false MLFLOW_AUTH_CONFIG_PATH="$MLFLOW_AUTH_CONFIG_PATH" \
  MLFLOW_FLASK_SERVER_SECRET_KEY="$MLFLOW_FLASK_SERVER_SECRET_KEY" \
  mlflow server --app-name basic-auth --backend-store-uri "sqlite:///$TRAINYARD_HOME/mlflow/mlflow.db" \
  --port "$MLFLOW_PORT" --workers 1
for component in api-server scheduler dag-processor triggerer; do
  start "$component" airflow "$component"
done
shopt -s nullglob
for team in "$AIRFLOW_HOME"/team_dags/*/; do  # the teams scripts/render_airflow_cfg.py made bundles for
  team=$(basename "$team")
  # the shared triggerer serves the triggers' logs (one log server per host and port)
  start "triggerer-$team" airflow triggerer --team-name "$team" --skip-serve-logs
done
pw_file=$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated
for _ in $(seq 1 120); do
  curl -sf "http://localhost:8080/api/v2/monitor/health" >/dev/null 2>&1 && [ -s "$pw_file" ] && break
  sleep 1
done
start mlflow-users env MLFLOW_TRACKING_URI="http://localhost:$MLFLOW_PORT" \
  MLFLOW_TRACKING_USERNAME="$SERVICE_USER" MLFLOW_TRACKING_PASSWORD="$SERVICE_PASSWORD" PYTHONPATH=plugins \
  bash -c 'while :; do python -m trainyard_airflow.mlflow_users || true; sleep 60; done'
echo "Airflow UI + REST API: http://localhost:8080   (users and generated passwords: $pw_file)"
cat "$pw_file"; echo
echo "MLflow UI:             http://localhost:$MLFLOW_PORT   (the same users and passwords; a team's new work shows within a minute)"
echo "TensorBoard:           tensorboard --logdir $TRAINYARD_HOME/tensorboard   (no login: every team's curves; the tasks link it where TRAINYARD_TENSORBOARD_URL says)"
echo "Logs: $AIRFLOW_HOME/*.log. Ctrl-C stops them all."
status=0
wait -n "${pids[@]}" || status=$?
echo "a component exited (status $status); stopping the others (see its log in $AIRFLOW_HOME)" >&2
exit "$status"
