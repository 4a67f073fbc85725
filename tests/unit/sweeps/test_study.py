"""Why the sweeps keep their own stale-trial rule (trainyard.sweeps.study): Optuna's journal storage, the
default, has no heartbeat. Once an Optuna release gives it one, this fails: use Optuna's then."""

from optuna.storages import JournalStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat  # private: an ImportError here asks the same question


def test_only_optunas_database_storage_has_a_heartbeat():
    assert issubclass(RDBStorage, BaseHeartbeat)
    assert not issubclass(JournalStorage, BaseHeartbeat)
