"""scripts/spec_auto.py --physical: the rooms' CPUs one hardware thread per physical core,
read from a sysfs tree built here (the expected CPUs written out by hand)."""

from pathlib import Path

import pytest

from scripts.spec_auto import main, parse_cpu_list, physical_cpus, physical_slots


def _sysfs(tmp_path: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}
    with pytest.raises(ValueError):
        parse_cpu_list("a-b")


def test_siblings_n_apart(tmp_path):
    # 8 cores x 2 threads, thread i and i+8 on one core (the usual x86 numbering)
    fs = _sysfs(tmp_path, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    assert physical_cpus(set(range(16)), fs) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert physical_slots(5, 3, set(range(16)), fs) == [[0, 1, 2], [3, 4, 5]]


def test_siblings_adjacent(tmp_path):
    # 8 cores x 2 threads, threads 2j and 2j+1 on one core
    fs = _sysfs(tmp_path, {c: f"{c - c % 2}-{c - c % 2 + 1}" for c in range(16)})
    assert physical_cpus(set(range(16)), fs) == [0, 2, 4, 6, 8, 10, 12, 14]
    assert physical_slots(2, 3, set(range(16)), fs) == [[0, 2, 4], [6, 8, 10]]
    assert physical_slots(1, 3, set(range(16)), fs) == [[0, 2, 4]]


def test_only_allowed_cpus(tmp_path):
    # a process allowed 1, 9 and 3: 1 and 9 share a core, 3 is a core of its own
    fs = _sysfs(tmp_path, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    assert physical_cpus({9, 1, 3}, fs) == [1, 3]
    # the sibling of an allowed cpu that is itself not allowed is never used
    assert physical_cpus({9, 3}, fs) == [3, 9]


def test_no_topology_and_small_machine(tmp_path):
    # no sysfs at all: every CPU a core of its own; 2 CPUs, rooms of 3: one room of both
    assert physical_cpus({0, 1}, tmp_path / "none") == [0, 1]
    assert physical_slots(5, 3, {0, 1}, tmp_path / "none") == [[0, 1]]
    # 2 vCPUs each its own core (this VM's sysfs): rooms of 1, two at a time
    fs = _sysfs(tmp_path, {0: "0", 1: "1"})
    assert physical_slots(5, 1, {0, 1}, fs) == [[0], [1]]


@pytest.mark.parametrize("flag", ["--cores", "--slots", "--repeat"])
def test_a_count_below_one_is_one_line_and_exit_2(flag, monkeypatch, capsys, tmp_path):
    # --cores 0 divided by zero in physical_slots; --slots 0 left a room queue that never ran
    monkeypatch.setattr("sys.argv", ["spec_auto.py", "--resume", str(tmp_path / "r.json"), "--physical", flag, "0"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    assert f"{flag} must be at least 1 (got 0)" in capsys.readouterr().err
