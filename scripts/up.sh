#!/usr/bin/env bash
# Start the Airflow UI + REST API (`airflow standalone`) and the MLflow UI on localhost; Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
MLFLOW_PORT=${MLFLOW_PORT:-5000}
# (no job runner: it serves GenAI features trainyard does not use)
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri "sqlite:///$TRAINYARD_HOME/mlflow/mlflow.db" --port "$MLFLOW_PORT" \
  >"$AIRFLOW_HOME/mlflow-ui.log" 2>&1 &
mlflow_pid=$!
trap 'kill $mlflow_pid 2>/dev/null || true' EXIT
airflow standalone >"$AIRFLOW_HOME/standalone.log" 2>&1 &
af_pid=$!
trap 'kill $af_pid $mlflow_pid 2>/dev/null || true' EXIT
pw_file=$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated
for _ in $(seq 1 120); do
  curl -sf "http://localhost:8080/api/v2/monitor/health" >/dev/null 2>&1 && [ -s "$pw_file" ] && break
  sleep 1
done
echo "Airflow UI + REST API: http://localhost:8080   (users and generated passwords: $pw_file)"
cat "$pw_file"; echo
echo "MLflow UI:             http://localhost:$MLFLOW_PORT"
echo "TensorBoard:           tensorboard --logdir $TRAINYARD_HOME/tensorboard"
echo "Logs: $AIRFLOW_HOME/standalone.log, $AIRFLOW_HOME/mlflow-ui.log. Ctrl-C stops both."
wait $af_pid
