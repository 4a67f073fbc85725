"""The Fleet page's HTML (trainyard_airflow.pages.render): what a user chose (a run id, a reason naming a
job) is text on the page, never markup."""

from html import escape

from trainyard_airflow.pages import render


def test_the_fleet_page_escapes_what_users_chose():
    job = {
        "run": "train_pipeline.default/<script>alert(1)</script>",
        "gpu_type": "a100",
        "state": "waiting",
        "team": "vision",
        "user": "tina",
        "gpus": 2,
        "priority": 1,
        "waited_minutes": 3.0,
        "reason": "behind <b>x</b>",
    }
    other = {"gpu_type": "a100", "state": "admitted", "team": "nlp", "gpus": 4, "priority": 5}
    others_waiting = {"gpu_type": "a100", "state": "waiting", "team": "nlp", "gpus": 1, "priority": 2}
    view = {
        "gpu_types": [
            {
                "gpu_type": "a100",
                "slots": 4,
                "in_use": 4,
                "free": 0,
                "price_per_hour": 2.5,
                "holders": [other],
                "waiting": [job, others_waiting],
            }
        ],
        "teams": [
            {
                "team": "vision",
                "quota": {"a100": 2},
                "borrowing_limit": {},
                "lending_limit": {},
                "spent": 1.5,
                "committed": 0.0,
                "budget": None,
                "left": None,
            },
            {"team": "nlp", "quota": {"a100": 2}, "borrowing_limit": {"a100": 1}, "lending_limit": {}},
        ],
    }
    view["utilisation"] = {"hours": 24.0, "utilisation": 0.5, "pools": {"a100": {"utilisation": 0.5}}, "teams": {}}
    page = render(view)
    assert "Utilisation, last 24 h: 50%</h2><p>a100 50%</p>" in page and 'src="fleet/utilisation.png"' in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "behind &lt;b&gt;x&lt;/b&gt;" in page
    # a waiting job of another team: team, GPUs and priority, and no start
    assert (
        "<td>nlp</td><td>-</td><td>1</td><td>2</td><td>-</td><td>-</td><td>(another team&#x27;s job)</td><td>-</td>"
        in page
    )
    assert "a100: 4 of 4 slots in use, 0 free ($2.50 an hour a slot)" in page
    assert "(another team&#x27;s job)" in page and "(not your team)" in page
    assert "<td>vision</td><td>a100: 2</td><td>-</td><td>-</td><td>$1.50</td><td>$0.00</td><td></td><td></td>" in page


def test_the_fleet_shows_a_team_its_own_jobs_and_money_and_others_only_what_everyone_sees(tmp_path, monkeypatch):
    """The view behind the page and `trainyard queue` (trainyard.scheduling.fleet_view), on a real ledger."""
    from fleets import local_fleet
    from trainyard.acting import Acting
    from trainyard.scheduling.admission.policy import Job
    from trainyard.scheduling.fleet_view import fleet

    ledger = local_fleet(
        tmp_path,
        monkeypatch,
        "gpu_types:\n  a100: {count: 4, price_per_hour: 2.0}\n"
        "teams:\n  vision: {quota: {a100: 2}, monthly_budget: 100}\n  nlp: {quota: {a100: 2}}\n",
    )
    assert ledger.request(Job("train_pipeline.nlp/r1", "nlp", "a100", 4, 1, 1.0, "nina")).admitted
    assert not ledger.request(Job("train_pipeline.vision/r2", "vision", "a100", 2, 1, 1.0, "tina")).admitted

    view = fleet(ledger.config, ledger, Acting("tina", ("vision",)))
    (a100,) = view["gpu_types"]
    assert (a100["slots"], a100["in_use"], a100["free"]) == (4, 4, 0)
    assert a100["holders"] == [{"gpu_type": "a100", "state": "admitted", "team": "nlp", "gpus": 4, "priority": 1}]
    (mine,) = a100["waiting"]
    assert mine["run"] == "train_pipeline.vision/r2" and mine["user"] == "tina" and mine["why"] == "slots_in_use"
    nlp_ends = next(e.admitted for e in ledger.entries() if e.admitted is not None) + 3600  # its max_hours
    assert mine["starts_by"] == nlp_ends and mine["start"].startswith("starts by ")
    page = render(view)  # the waiting table says when each job starts; the holding one has no such column
    assert page.count("<th>start</th>") == 1 and f"<td>{escape(mine['start'])}</td>" in page
    teams = {t["team"]: t for t in view["teams"]}
    assert teams["vision"]["budget"] == 100 and teams["vision"]["left"] is not None
    assert "spent" not in teams["nlp"] and teams["nlp"]["quota"] == {"a100": 2}  # the inventory is everyone's
    admin = fleet(ledger.config, ledger, Acting("root", (), admin=True))
    assert admin["gpu_types"][0]["holders"][0]["user"] == "nina"
    assert view["hosts"] == []  # no worker host announced itself: nothing routed


def test_the_fleet_shows_each_host_s_devices_and_who_holds_them(tmp_path, monkeypatch):
    """The hosts the workers announce (trainyard worker), each device free or held, a team's run named to its
    members only; a host that retired shown as gone; the page escapes what hosts are named."""
    from fleets import local_fleet
    from trainyard.acting import Acting
    from trainyard.scheduling.admission.ledger import Ledger
    from trainyard.scheduling.admission.policy import Job
    from trainyard.scheduling.fleet_view import fleet
    from trainyard_airflow.pages import render

    ledger = local_fleet(
        tmp_path,
        monkeypatch,
        "gpu_types:\n  a100: {count: 4, price_per_hour: 2.0}\n  cpu: {count: 2, price_per_hour: 0.0}\n"
        "teams:\n  vision: {quota: {a100: 2, cpu: 2}}\n  nlp: {quota: {a100: 2}}\n",
    )
    on_a = Ledger(ledger.db.where, ledger.config, host="gpu-a")
    on_a.announce({"a100": ["0", "1"], "cpu": []})
    old = Ledger(ledger.db.where, ledger.config, host="<b>old</b>")
    old.announce({"a100": ["0"]})
    old.retire({"a100": ["0"]})
    job = Job("train_pipeline.nlp/r1", "nlp", "a100", 1, 1, 1.0, "nina")
    assert on_a.request(job).admitted and on_a.claim_devices(job.id, 1, ["0", "1"]) == ["0"]

    def devices(reader: Acting) -> dict[tuple[str, str], tuple[bool, list]]:
        return {
            (h["host"], h["gpu_type"]): (h["serving"], [(d["device"], d["team"], d["run"]) for d in h["devices"]])
            for h in fleet(ledger.config, ledger, reader)["hosts"]
        }

    assert devices(Acting("nina", ("nlp",))) == {
        ("<b>old</b>", "a100"): (False, [("0", None, None)]),
        ("gpu-a", "a100"): (True, [("0", "nlp", "train_pipeline.nlp/r1"), ("1", None, None)]),
        ("gpu-a", "cpu"): (True, []),
    }
    assert devices(Acting("tina", ("vision",)))[("gpu-a", "a100")] == (True, [("0", "nlp", None), ("1", None, None)])
    page = render(fleet(ledger.config, ledger, Acting("tina", ("vision",))))
    assert "<h2>Hosts</h2>" in page and "<td>0: a job of nlp; 1: free</td>" in page
    assert "&lt;b&gt;old&lt;/b&gt;</td><td>a100</td><td>gone</td><td>0: -</td>" in page and "<b>old</b>" not in page


def test_the_fleets_use_shows_a_reader_their_teams_by_name_and_the_others_as_one():
    """A team's use over time, at the prices the page shows, is its spend: only its members see it by name."""
    from trainyard.acting import Acting
    from trainyard.scheduling.resources import parse_resources
    from trainyard.scheduling.utilisation import Allocation, report
    from trainyard_airflow.pages import OTHER_TEAMS, seen_by

    config = parse_resources(
        "gpu_types:\n  a100: {count: 4, price_per_hour: 2.0}\n"
        "teams:\n  vision: {quota: {a100: 2}}\n  nlp: {quota: {a100: 1}}\n  research: {quota: {a100: 1}}\n"
    )
    used = [
        Allocation("train_pipeline.vision/a", "vision", "a100", 2, 0.0, 1800.0),
        Allocation("train_pipeline.nlp/b", "nlp", "a100", 1, 0.0, 3600.0),
        Allocation("train_pipeline.research/c", "research", "a100", 1, 1800.0, 3600.0),
    ]
    seen = seen_by(Acting("tina", ("vision",)), used)
    assert [a.team for a in seen] == ["vision", OTHER_TEAMS, OTHER_TEAMS]
    teams = report(config, seen, 0.0, 3600.0).as_dict()["teams"]
    assert set(teams) == {"vision", OTHER_TEAMS} and teams[OTHER_TEAMS]["allocated_s"] == 5400.0
    assert [a.team for a in seen_by(Acting("root", (), admin=True), used)] == ["vision", "nlp", "research"]
