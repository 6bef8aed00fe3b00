"""`kbench probe NAME`: the probes are a documented command of the package, not scripts."""

from __future__ import annotations

from kbench.cli import main
from kbench.probes import PROBES


def test_probe_help_lists_every_probe(capsys):
    assert main(["probe", "--help"]) == 0
    out = capsys.readouterr().out
    missing = [name for name in PROBES if name not in out]
    assert not missing, f"kbench probe --help does not list {missing}:\n{out}"


def test_an_unknown_probe_is_a_usage_error(capsys):
    assert main(["probe", "bandwidth"]) == 2
    assert "probes:" in capsys.readouterr().err


def test_the_read_floor_probe_runs_on_this_device(capsys):
    assert main(["probe", "read_floor", "--small"]) == 0
    assert "# floor small:" in capsys.readouterr().out
