"""trainyard's Airflow layer: the DAGs' operators, triggers and hooks, the executors, the auth manager.

Importing it (every DAG file does, and the executors before they preload the libraries) sets what the
libraries need to log through Python's logging inside a task: Airflow records every line a task writes to
stderr as an ERROR, so MLflow's own stderr handler (its INFO lines) and its download progress bars made
red lines in tasks that succeeded. Set only where unset: an operator's own choice stands.
"""

import os

LIBRARY_ENV = {
    "MLFLOW_CONFIGURE_LOGGING": "false",  # read when mlflow is imported: its loggers propagate to Airflow's
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}
for _name, _value in LIBRARY_ENV.items():
    os.environ.setdefault(_name, _value)
