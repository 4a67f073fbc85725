#!/usr/bin/env bash
# Run the job's team's train_pipeline.<team> once, end to end, through Airflow (`airflow dags test`: the real DAG, tasks and
# database, in one process), then print where the results are.
set -euo pipefail
cd "$(dirname "$0")/.."
# JOB=include/config/jobs/<name>.yaml runs that job (shapes: detection, translation: seq2seq); the
# default is the digits job. TRAINYARD_DEMO_CONF (JSON) overrides fields on top.
JOB=${JOB:-include/config/jobs/digits.yaml}
OVERRIDES=${TRAINYARD_DEMO_CONF:-"{}"}
CONF=$(python - "$JOB" "$OVERRIDES" <<'PY'
import json, sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
spec.update(json.loads(sys.argv[2]))
print(json.dumps(spec))
PY
)
NAME=$(python -c 'import json, sys; print(json.loads(sys.argv[1]).get("name", "digits"))' "$CONF")
# the job's team's own training DAG (Airflow's multi-team mode: trainyard.teams.training_dag)
DAG=$(python -c 'import json, sys; from trainyard.teams import training_dag
print(training_dag((json.loads(sys.argv[1]).get("resources") or {}).get("team", "default")))' "$CONF")
log=$AIRFLOW_HOME/demo.log
echo "[demo] running $DAG for $JOB (about 1-2 minutes; full log: $log)"
echo "[demo] conf: $CONF"
start=$(date +%s)
if ! airflow dags test "$DAG" --conf "$CONF" >"$log" 2>&1; then
  tail -60 "$log"
  echo "[demo] $DAG FAILED; full log: $log" >&2
  exit 1
fi
grep -E "\[trainer\]|registered|evaluation:|gate passed|ONNX parity|pinned to commit" "$log" | grep -v "Returned value" \
  | sed -E 's/^.*\[(info|warning) *\] /  /; s/ \[[a-z_.]+\] loc=[^ ]+$//' | cut -c1-200 || true
echo "[demo] finished in $(( $(date +%s) - start ))s"
trainyard show "$NAME"
