"""The audit trail: a hash chain that names an edited, removed or reordered entry, survives a torn write,
catches a cut-off end against a recorded head, and stays one chain under concurrent writers."""

import json
import multiprocessing

import pytest

from trainyard.audit import GENESIS, AuditLog, entry_hash


def trail(tmp_path, n=4) -> AuditLog:
    log = AuditLog(tmp_path / "audit.jsonl")
    for i in range(n):
        log.append("alias_move", f"user{i}", model="m", to_version=str(i))
    return log


def rewrite(log: AuditLog, change) -> None:
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join(change(lines)) + "\n")


def test_entries_are_chained_in_order(tmp_path):
    log = trail(tmp_path)
    entries = log.entries()
    assert [e["seq"] for e in entries] == [1, 2, 3, 4]
    assert entries[0]["prev"] == GENESIS and entries[1]["prev"] == entries[0]["hash"]
    assert all(e["hash"] == entry_hash(e) for e in entries)
    assert entries[2]["actor"] == "user2" and entries[2]["kind"] == "alias_move"
    assert log.verify() == ([], []) and log.head() == entries[-1]["hash"]


def test_an_edited_entry_is_named(tmp_path):
    log = trail(tmp_path)

    def edit(lines):
        e = json.loads(lines[1])
        e["to_version"] = "99"
        lines[1] = json.dumps(e, sort_keys=True)
        return lines

    rewrite(log, edit)
    problems, _ = log.verify()
    assert problems == [f"{log.path}:2: entry 2 was edited (its hash does not match it)"]


def test_an_edit_that_recomputes_the_hash_breaks_the_next_link(tmp_path):
    log = trail(tmp_path)

    def forge(lines):
        e = json.loads(lines[1])
        e["to_version"] = "99"
        e["hash"] = entry_hash(e)
        lines[1] = json.dumps(e, sort_keys=True)
        return lines

    rewrite(log, forge)
    (problem,) = log.verify()[0]
    assert problem.startswith(f"{log.path}:3: entry 3 does not follow the entry before it")


@pytest.mark.parametrize(
    "change, line",
    [
        (lambda lines: lines[:1] + lines[2:], 2),  # removed
        (lambda lines: [lines[0], lines[2], lines[1], lines[3]], 2),  # reordered
    ],
)
def test_a_removed_or_reordered_entry_is_named(tmp_path, change, line):
    log = trail(tmp_path)
    rewrite(log, change)
    problems, _ = log.verify()
    assert problems and problems[0].startswith(f"{log.path}:{line}: entry ")


def test_a_cut_off_end_is_caught_against_a_recorded_head(tmp_path):
    log = trail(tmp_path)
    head = log.head()
    rewrite(log, lambda lines: lines[:2])
    assert log.verify() == ([], [])  # a shorter chain is still a chain ...
    (problem,) = log.verify(head)[0]  # ... which no longer holds the head recorded before
    assert f"the recorded head {head} is not in the trail" in problem
    log.append("alias_move", "later", model="m")
    assert log.verify(log.entries()[1]["hash"]) == ([], [])  # an older head inside the trail is fine


def test_a_torn_line_is_a_note_and_the_chain_continues_past_it(tmp_path):
    log = trail(tmp_path, 2)
    with open(log.path, "ab") as f:
        f.write(b'{"kind": "alias_move", "mod')  # a writer died here
    log.append("alias_move", "next", model="m", to_version="2")
    problems, notes = log.verify()
    assert problems == [] and len(notes) == 1 and "torn line" in notes[0]
    assert [e["seq"] for e in log.entries()] == [1, 2, 3]


def test_the_trail_s_own_fields_and_an_empty_actor_are_refused(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(ValueError, match=r"\['hash'\] are the trail's own"):
        log.append("alias_move", "u", hash="x")
    with pytest.raises(ValueError, match="needs the acting user"):
        log.append("alias_move", "")


def _append_many(path: str, who: str, n: int, barrier) -> None:
    barrier.wait()
    log = AuditLog(path)
    for i in range(n):
        log.append("registration", who, version=str(i))


def test_concurrent_writers_make_one_chain(tmp_path):
    path = str(tmp_path / "audit.jsonl")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_append_many, args=(path, f"p{i}", 25, barrier)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    log = AuditLog(path)
    assert log.verify() == ([], [])
    entries = log.entries()
    assert [e["seq"] for e in entries] == list(range(1, 101))
    assert sorted((e["actor"], e["version"]) for e in entries) == sorted(
        (f"p{i}", str(j)) for i in range(4) for j in range(25)
    )


def test_the_command_says_tampered_and_fails(tmp_path, capsys):
    from trainyard.cli import main

    log = trail(tmp_path)
    assert main(["audit", "verify", "--path", str(log.path)]) == 0
    assert "4 entries, chain intact" in capsys.readouterr().out
    rewrite(log, lambda lines: lines[:1] + lines[2:])
    assert main(["audit", "verify", "--path", str(log.path)]) != 0
    captured = capsys.readouterr()
    assert "TAMPERED: " in captured.out and "was changed outside trainyard" in captured.err
    assert main(["audit", "log", "--path", str(log.path), "--last", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["seq"] == 4
