"""The executor imports [trainyard] preload_modules in the scheduler before it forks its workers (the
REST test runs it for real; bench/orchestration.py measures what it saves)."""

import sys

from trainyard_airflow import executors


def test_modules_are_imported_before_the_workers_are_forked(monkeypatch):
    seen = {}
    monkeypatch.setattr(executors.LocalExecutor, "start", lambda self: seen.update(loaded="colorsys" in sys.modules))
    monkeypatch.setattr(executors, "preload_modules", lambda: ["colorsys", "no_such_module_for_trainyard"])
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    executor = executors.PreloadingLocalExecutor(parallelism=1)
    executor.is_mp_using_fork = True
    executor.start()  # a module that cannot be imported is skipped, not fatal
    assert seen == {"loaded": True}


def test_nothing_is_preloaded_where_workers_are_spawned(monkeypatch):
    monkeypatch.setattr(executors.LocalExecutor, "start", lambda self: None)
    monkeypatch.setattr(executors, "preload_modules", lambda: ["colorsys"])
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    executor = executors.PreloadingLocalExecutor(parallelism=1)
    executor.is_mp_using_fork = False
    executor.start()
    assert "colorsys" not in sys.modules


def test_the_list_comes_from_the_config(monkeypatch):
    monkeypatch.setenv("AIRFLOW__TRAINYARD__PRELOAD_MODULES", " torch, mlflow,, ")
    assert executors.preload_modules() == ["torch", "mlflow"]
    monkeypatch.setenv("AIRFLOW__TRAINYARD__PRELOAD_MODULES", "")
    assert executors.preload_modules() == []
    monkeypatch.delenv("AIRFLOW__TRAINYARD__PRELOAD_MODULES")
    assert executors.preload_modules() == list(executors.DEFAULT_PRELOAD)  # the rendered config sets none


def test_a_celery_worker_preloads_them_when_it_starts(monkeypatch):
    """At Celery's worker_init, before the worker forks its pool (the cluster profile's CeleryExecutor)."""
    from celery.signals import worker_init

    from trainyard_airflow import celery_config

    monkeypatch.setattr(executors, "preload_modules", lambda: ["colorsys"])
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    worker_init.send(sender=None)
    assert "colorsys" in sys.modules
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    assert celery_config.CELERY_CONFIG is DEFAULT_CELERY_CONFIG  # Airflow's own, so a team's settings still win


def test_every_default_module_is_there_to_preload():
    """A module an upgrade moved would be skipped with a warning only (the exporter's is a private path)."""
    import importlib.util

    missing = [name for name in executors.DEFAULT_PRELOAD if importlib.util.find_spec(name) is None]
    assert not missing, f"gone from the installed packages: {missing}; update DEFAULT_PRELOAD"
