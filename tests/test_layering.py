"""The rules of docs/architecture.md, read from the source: which package may import which (only
kbench.runtime imports `vulkan`; cases and report never reach the runtime), records are built by
kbench.results, SPIR-V is loaded by kbench.shaders alone."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

KBENCH = Path(__file__).resolve().parents[1] / "kbench"

#: package -> the kbench packages (and "vulkan") it may import; "kbench" is the package root
#: (``kbench.__version__``). Lower layers first: no import runs back up.
ALLOWED: dict[str, set[str]] = {
    "kbench.quant": set(),
    "kbench.shaders": set(),
    "kbench.results": {"kbench"},
    "kbench.runtime": {"vulkan", "kbench.shaders"},
    "kbench.backend": {"kbench.runtime", "kbench.quant", "kbench.shaders"},
    "kbench.cases": {"kbench", "kbench.backend", "kbench.quant", "kbench.results", "kbench.shaders"},
    "kbench.foreign": {"kbench.backend", "kbench.cases", "kbench.quant", "kbench.results", "kbench.runtime",
                       "kbench.shaders"},
    "kbench.bench": {"kbench", "kbench.backend", "kbench.cases", "kbench.foreign", "kbench.quant",
                     "kbench.results", "kbench.runtime", "kbench.shaders"},
    "kbench.report": {"kbench", "kbench.results", "kbench.quant"},
    "kbench.probes": {"kbench.backend", "kbench.bench", "kbench.cases", "kbench.quant", "kbench.results",
                      "kbench.runtime", "kbench.shaders"},
    # what the commands print while they run (rich, tabulate; no kbench import)
    "kbench.console": set(),
    "kbench.cli": {"kbench", "kbench.bench", "kbench.cases", "kbench.console", "kbench.report", "kbench.results",
                   "kbench.shaders", "kbench.foreign", "kbench.probes"},
    "kbench.__main__": {"kbench.cli"},
    "kbench": set(),
}


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(KBENCH.parent)}:{node.lineno}"


def _modules() -> Iterator[tuple[Path, str, ast.Module]]:
    for path in sorted(KBENCH.rglob("*.py")):
        parts = list(path.relative_to(KBENCH.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield path, ".".join(parts), ast.parse(path.read_text(encoding="utf-8"), str(path))


def _package(module: str) -> str:
    """The top-level unit of a module: ``kbench.bench.runner`` -> ``kbench.bench``."""
    parts = module.split(".")
    if parts[0] != "kbench":
        return parts[0]
    return ".".join(parts[:2])


def _imports(path: Path, module: str, tree: ast.Module) -> Iterator[tuple[int, str]]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            elif node.module:
                yield node.lineno, node.module
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def test_every_package_imports_only_the_layers_below_it():
    wrong = []
    for path, module, tree in _modules():
        package = _package(module)
        assert package in ALLOWED, f"{path}: package {package} has no row in ALLOWED (docs/architecture.md)"
        for line, target in _imports(path, module, tree):
            dep = _package(target)
            if dep not in ("kbench", "vulkan") and not target.startswith("kbench."):
                continue  # the standard library and third-party packages
            if dep != package and dep not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(KBENCH.parent)}:{line}: {package} imports {target}")
    assert not wrong, "imports against the layering of docs/architecture.md:\n" + "\n".join(wrong)


def _nodes_outside(package: str) -> Iterator[tuple[Path, ast.AST]]:
    """Every AST node of every module that is not in ``package``."""
    for path, module, tree in _modules():
        if _package(module) != package:
            for node in ast.walk(tree):
                yield path, node


def test_only_the_runtime_imports_vulkan():
    users = sorted({p for p, allowed in ALLOWED.items() if "vulkan" in allowed})
    assert users == ["kbench.runtime"], users


def test_records_are_built_by_kbench_results():
    hand_made = []
    for path, node in _nodes_outside("kbench.results"):
        if isinstance(node, ast.Dict) and any(
                isinstance(key, ast.Constant) and key.value == "kind" and isinstance(value, ast.Constant)
                and value.value in ("run", "case", "peak") for key, value in zip(node.keys, node.values)):
            hand_made.append(_where(path, node))
    assert not hand_made, ("records built by hand (use kbench.results.case_record / peak_record / "
                           "collect_provenance):\n" + "\n".join(hand_made))


def test_spirv_is_loaded_by_kbench_shaders_alone():
    elsewhere = []
    for path, node in _nodes_outside("kbench.shaders"):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        spv_path = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("spv/")
        if name == "SPV_DIR" or spv_path or (isinstance(node, ast.FunctionDef) and node.name == "load_spirv"):
            elsewhere.append(_where(path, node))
    assert not elsewhere, "SPIR-V read outside kbench.shaders (use kbench.shaders.load_spirv):\n" + "\n".join(elsewhere)
