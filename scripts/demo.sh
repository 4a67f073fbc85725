#!/usr/bin/env bash
# Run train_pipeline once, end to end, through Airflow (`airflow dags test`: the real DAG, tasks and
# database, in one process), then print where the results are.
set -euo pipefail
cd "$(dirname "$0")/.."
CONF=${TRAINYARD_DEMO_CONF:-'{}'}
log=$AIRFLOW_HOME/demo.log
echo "[demo] running train_pipeline with conf $CONF (about 1-2 minutes; full log: $log)"
start=$(date +%s)
if ! airflow dags test train_pipeline --conf "$CONF" >"$log" 2>&1; then
  tail -60 "$log"
  echo "[demo] train_pipeline FAILED; full log: $log" >&2
  exit 1
fi
grep -E "\[trainer\]|registered|evaluation:|gate passed|ONNX parity|pinned to commit" "$log" | grep -v "Returned value" \
  | sed -E 's/^.*\[(info|warning) *\] /  /; s/ \[[a-z_.]+\] loc=[^ ]+$//' | cut -c1-200 || true
echo "[demo] finished in $(( $(date +%s) - start ))s"
trainyard show digits
