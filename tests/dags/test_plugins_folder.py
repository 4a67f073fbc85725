"""Airflow imports each .py file of the plugins folder as a top-level module named after the file; only
airflow_local_settings.py and the plugin itself (trainyard_plugin.py) may be loaded that way, or package
modules would shadow real libraries."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_plugin_loader_sees_only_the_local_settings_and_the_plugin():
    from airflow._shared.module_loading import find_path_from_directory

    files = sorted(
        Path(p).relative_to(REPO / "plugins").as_posix()
        for p in find_path_from_directory(str(REPO / "plugins"), ".airflowignore")
        if p.endswith(".py")
    )
    assert files == ["airflow_local_settings.py", "trainyard_plugin.py"]


def test_the_plugin_registers_the_links_of_the_training_tasks():
    from trainyard_airflow.links import LINKS, ModelVersionLink
    from trainyard_plugin import TrainyardPlugin

    registered = [link.name for link in TrainyardPlugin.operator_extra_links]
    assert registered == [link.name for link in (*LINKS, ModelVersionLink())]
