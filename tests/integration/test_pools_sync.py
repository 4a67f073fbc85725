"""`trainyard pools sync` against this worker's Airflow database: Airflow's GPU pools come to match
resources.yaml, a second sync changes nothing, a GPU pool the file dropped is deleted, other pools are
left alone."""

import textwrap
from types import SimpleNamespace

import pytest

from trainyard.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture
def sync(capsys):
    """`trainyard pools sync ARGS` in this process; afterwards the pools are the shipped file's again."""
    from airflow.models.pool import Pool

    def run(*args: str) -> SimpleNamespace:
        capsys.readouterr()
        code = main(["pools", "sync", *args])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    yield run
    assert main(["pools", "sync"]) == 0
    if Pool.get_pool("etl") is not None:
        Pool.delete_pool("etl")


def _pools() -> dict[str, tuple[int, bool]]:
    from airflow.models.pool import Pool

    return {p.pool: (p.slots, p.include_deferred) for p in Pool.get_pools()}


def test_sync_makes_the_pools_match_the_file_and_is_idempotent(tmp_path, sync):
    from airflow.models.pool import Pool

    fleet = tmp_path / "resources.yaml"
    fleet.write_text(
        textwrap.dedent(
            """\
            gpu_types:
              cpu: {count: 2, price_per_hour: 0}
              l4-24gb: {count: 3, price_per_hour: 0.7}
            teams:
              default: {quota: {cpu: 2, l4-24gb: 3}}
            """
        )
    )
    Pool.create_or_update_pool("gpu-retired", 4, "a GPU type no longer in the file", True)
    Pool.create_or_update_pool("etl", 5, "not trainyard's", False)

    first = sync("--resources", str(fleet))
    assert first.returncode == 0, first.stderr
    assert "gpu-l4-24gb          created: 3 slot(s)" in first.stdout
    assert "gpu-retired          deleted (not in the file)" in first.stdout
    pools = _pools()
    assert pools["gpu-l4-24gb"] == (3, True) and pools["gpu-cpu"] == (2, True)
    assert "gpu-retired" not in pools and pools["etl"] == (5, False)

    again = sync("--resources", str(fleet))
    assert again.returncode == 0 and again.stdout.count("unchanged") == 2, again.stdout

    fleet.write_text(fleet.read_text().replace("count: 3", "count: 5").replace("l4-24gb: 3", "l4-24gb: 5"))
    dry = sync("--resources", str(fleet), "--dry-run")
    assert "gpu-l4-24gb          updated: 5 slot(s) (was 3)" in dry.stdout
    assert _pools()["gpu-l4-24gb"] == (3, True)  # a dry run changes nothing
    assert sync("--resources", str(fleet)).returncode == 0 and _pools()["gpu-l4-24gb"] == (5, True)


def test_a_faulty_file_is_refused_with_its_line_before_anything_changes(tmp_path, sync):
    before = _pools()
    fleet = tmp_path / "resources.yaml"
    fleet.write_text("gpu_types:\n  cpu: {count: 2, price_per_hour: 0}\nteams:\n  default: {quota: {cpu: 3}}\n")
    proc = sync("--resources", str(fleet))
    assert proc.returncode == 1
    assert f"{fleet}:4: teams.default.quota.cpu: 3 slots, but cpu has 2" in proc.stderr
    assert _pools() == before
