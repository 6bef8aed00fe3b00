"""Print kbench's requirements from pyproject.toml, one per line, for `pip install -r`.

usage: requirements_from_pyproject.py PYPROJECT [--extras a,b] [--skip name,name]
"""
from __future__ import annotations

import argparse
import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib


def _normalise(name: str) -> str:
    """PEP 503 name, so that 'Foo_Bar' matches 'foo-bar>=1'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _split(csv: str) -> list[str]:
    return [x.strip() for x in csv.split(",") if x.strip()]


def requirements(pyproject: dict, extras: list[str], skip: set[str]) -> list[str]:
    """The project's dependencies plus the named optional groups, less the skipped names."""
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"unknown extras {unknown}; pyproject.toml has {sorted(optional)}")
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += optional[extra]
    skipped = {_normalise(s) for s in skip}
    return [r for r in reqs if _normalise(re.split(r"[<>=!~\[;@ ]", r, maxsplit=1)[0]) not in skipped]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pyproject")
    parser.add_argument("--extras", default="")
    parser.add_argument("--skip", default="")
    args = parser.parse_args()
    with open(args.pyproject, "rb") as f:
        data = tomllib.load(f)
    print("\n".join(requirements(data, _split(args.extras), set(_split(args.skip)))))


if __name__ == "__main__":
    main()
