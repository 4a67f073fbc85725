"""`trainyard runs list` / `runs compare` on a real MLflow store: numbers compared as numbers, `or`,
the newest N, differing params marked, the curves' PNG, table / json / csv."""

import csv
import io
import json

import pytest

from trainyard.cli import main
from trainyard.tracking import mlflow_tracking as mt
from trainyard.tracking.runs import FilterError, Query, find, parse_condition


@pytest.fixture
def runs(trainyard_home):
    """Four runs of two jobs, as trainyard logs them (flattened params, tags, metric histories): digits of
    team vision, shapes of team nlp."""
    c = mt.client()
    made = {}
    for job, lr, acc, commit in (
        ("digits", "1e-05", 0.41, "aaaa1111"),
        ("digits", "0.005", 0.93, "aaaa1111"),
        ("digits", "0.1", 0.97, "bbbb2222"),
        ("shapes", "0.002", 0.55, "aaaa1111"),
    ):
        team = "vision" if job == "digits" else "nlp"
        tags = {"dataset.commit": commit, "triggered_by": "ann"}
        run_id = mt.ensure_run(c, job, f"train_pipeline/{job}-{lr}", f"{job}-{lr}", team, tags)
        mt.log_params(c, run_id, {"recipe": "digits_cnn", "hyperparameters": {"learning_rate": lr, "epochs": 3}})
        for step in range(1, 4):
            c.log_metric(run_id, "train_loss", 1.0 / (step * float(lr) * 100 + 1), step=step)
        c.log_metric(run_id, "val_accuracy", acc, step=3)
        made[(job, lr)] = run_id
    return made


def test_a_numeric_filter_compares_numbers_where_text_would_not(runs):
    c = mt.client()
    with pytest.raises(Exception, match="Invalid comparator '<'"):  # MLflow compares params as text, = or LIKE
        c.search_runs(
            [c.get_experiment_by_name("digits").experiment_id], "params.`hyperparameters.learning_rate` < '0.01'"
        )
    assert not "1e-05" < "0.01"  # what a comparison of the params as text would answer
    found = find(c, Query(name="digits", where=[parse_condition("hyperparameters.learning_rate < 0.01")]))
    assert {r.run_id for r in found} == {runs[("digits", "1e-05")], runs[("digits", "0.005")]}


def test_conditions_and_alternatives_across_jobs(runs):
    c = mt.client()
    query = Query(
        tags={"dataset.commit": "aaaa1111"},
        where=[
            parse_condition("hyperparameters.learning_rate < 0.01"),
            parse_condition("val_accuracy > 0.9 or val_accuracy < 0.5"),
        ],
    )
    assert {r.run_id for r in find(c, query)} == {runs[("digits", "1e-05")], runs[("digits", "0.005")]}
    assert len(find(c, Query(limit=2))) == 2  # the newest two
    with pytest.raises(FilterError, match="none of the 4 runs has a param, metric or tag 'learning_rate'"):
        find(c, Query(where=[parse_condition("learning_rate < 0.01")]))
    with pytest.raises(FilterError, match="write NAME OP VALUE"):
        parse_condition("val_accuracy is high")


def test_runs_list_best_and_formats(runs, capsys, login_as):
    login_as("admin", "admin")
    assert main(["runs", "list", "--job", "digits", "--best", "val_accuracy", "--format", "json"]) == 0
    (best,) = json.loads(capsys.readouterr().out)
    assert best["run_id"] == runs[("digits", "0.1")] and best["hyperparameters.learning_rate"] == "0.1"
    assert main(["runs", "list", "--user", "ann", "--dataset-commit", "aaaa1111", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 3 and {"run_id", "job", "val_accuracy"} <= set(rows[0])
    assert main(["runs", "list", "--where", "nonsense"]) == 1
    assert "trainyard: error: cannot read 'nonsense'" in capsys.readouterr().err


def test_runs_compare_marks_what_differs_and_draws_the_curves(runs, capsys, tmp_path, login_as):
    from PIL import Image

    login_as("alice")  # of team vision, whose runs these are
    png = tmp_path / "curves.png"
    ids = [runs[("digits", "1e-05")], runs[("digits", "0.1")]]
    assert main(["runs", "compare", *ids, "--curves", "train_loss,val_accuracy", "--png", str(png)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("* hyperparameters.learning_rate") for line in lines), lines
    assert any(line.startswith("  hyperparameters.epochs") for line in lines), lines  # the same in both
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size[1] > 400  # two panels


def test_a_user_lists_and_compares_only_their_teams_runs(runs, capsys, login_as, no_login):
    assert main(["runs", "list", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # nobody logged in: no team's runs
    login_as("bob")  # teams default and nlp
    assert main(["runs", "list", "--format", "json"]) == 0
    assert {r["job"] for r in json.loads(capsys.readouterr().out)} == {"shapes"}
    assert main(["runs", "compare", runs[("digits", "0.1")], runs[("shapes", "0.002")]]) == 1
    assert f"run {runs[('digits', '0.1')]} belongs to team 'vision'; user 'bob'" in capsys.readouterr().err
    login_as("admin", "admin")
    assert main(["runs", "list", "--format", "json"]) == 0
    assert {r["job"] for r in json.loads(capsys.readouterr().out)} == {"digits", "shapes"}
