"""One flag name per meaning across the commands: --format json everywhere (--json kept on
`kbench devices` as a deprecated alias)."""
from __future__ import annotations

import json

import pytest

from kbench.cli import build_parser, main


@pytest.mark.parametrize("command", ["devices", "cases", "peaks"])
def test_every_listing_command_takes_format_json(command):
    args = build_parser().parse_args([command, "--format", "json"])
    assert args.format == "json"


def test_cases_format_json_lists_ids_and_params(capsys):
    assert main(["cases", "--format", "json", "-k", "add[size=1000]"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == [{"case_id": "add[size=1000]", "case": "add", "params": {"size": 1000}, "layer": "backend"}], got


def test_devices_json_is_a_deprecated_alias_of_format_json(capsys):
    assert main(["devices", "--backend", "numpy", "--format", "json"]) == 0
    new = capsys.readouterr().out
    assert main(["devices", "--backend", "numpy", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.out == new and json.loads(new), "--json should print what --format json prints"
    assert "deprecated" in captured.err and "--format json" in captured.err, captured.err


def test_a_closed_pipe_ends_the_listing_quietly():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    # `true` exits at once: the listing writes into a closed pipe, as with `| head -3` on a long list
    proc = subprocess.run(f"'{sys.executable}' -m kbench cases --mode validate | true", shell=True,
                          capture_output=True, text=True, cwd=root, timeout=120)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def _subcommands() -> list[str]:
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


@pytest.mark.parametrize("argv", [[]] + [[c] for c in _subcommands()], ids=lambda a: " ".join(a) or "kbench")
def test_help_prints_for_kbench_and_every_command(argv, capsys):
    # argparse %-formats help strings: a bare '%' in one crashes --help with a TypeError
    try:
        code = main([*argv, "--help"])      # report, compare and probe hand --help to their own parsers
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr().out
    assert code in (0, None), f"kbench {' '.join(argv)} --help exited {code}:\n{out}"
    assert "usage:" in out.lower(), f"kbench {' '.join(argv)} --help printed no usage:\n{out}"
