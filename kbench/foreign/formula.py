"""Formulas in kernel declarations: dispatch grids, push-constant values, buffer sizes, and
NumPy reference expressions for ops outside the ComputeBackend set.

A formula is a Python expression parsed with :mod:`ast` and evaluated over a whitelist: numbers,
the names the caller provides (an op's arguments, a case's parameters), arithmetic, comparisons,
``a if c else b`` and calls of the functions below. Anything else (attributes, subscripts of
unknown objects, lambdas, comprehensions, imports) is refused when the declaration is read, so
a declaration can describe a kernel but cannot run code.
"""

from __future__ import annotations

import ast
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


class FormulaError(ValueError):
    """A formula that cannot be parsed, names something unknown, or fails to evaluate."""


def _ceil_div(a: Any, b: Any) -> int:
    return -(-int(a) // int(b))


def f32_bits(x: Any) -> int:
    """The bits of ``x`` as a float32, read as an unsigned 32-bit integer."""
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def _sigmoid(x: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


#: functions of integer/float formulas (grids, push constants, sizes, bytes, FLOPs)
SCALAR_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "ceil_div": _ceil_div, "ceil": lambda x: int(math.ceil(x)), "floor": lambda x: int(math.floor(x)),
    "min": min, "max": max, "int": int, "float": float, "abs": abs, "sqrt": math.sqrt,
    "log2": math.log2, "f32_bits": f32_bits,
}

#: functions of reference expressions (float64 NumPy arrays)
ARRAY_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs,
    "maximum": np.maximum, "minimum": np.minimum, "where": np.where, "sum": np.sum,
    "max": np.max, "min": np.min, "mean": np.mean, "sigmoid": _sigmoid,
    "silu": lambda x: np.asarray(x, np.float64) * _sigmoid(x), "erf": np.vectorize(math.erf),
    "dot": np.dot, "reshape": np.reshape, "arange": np.arange, "cos": np.cos, "sin": np.sin,
    "float64": lambda x: np.asarray(x, np.float64),
}

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
           ast.Pow: lambda a, b: a ** b, ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b,
           ast.BitAnd: lambda a, b: a & b, ast.BitOr: lambda a, b: a | b}
_UNARY = {ast.USub: lambda a: -a, ast.UAdd: lambda a: +a, ast.Not: lambda a: not a}
_COMPARE = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
            ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b}


@dataclass(frozen=True)
class Formula:
    """A parsed formula; ``names`` are the free names it uses (functions excluded)."""

    text: str
    tree: ast.Expression
    names: frozenset[str]
    functions: Mapping[str, Callable[..., Any]]

    def __call__(self, env: Mapping[str, Any]) -> Any:
        missing = sorted(self.names - set(env))
        if missing:
            raise FormulaError(f"formula {self.text!r} uses {', '.join(missing)}, which this call does not have "
                               f"(known: {', '.join(sorted(env)) or 'none'})")
        try:
            return _eval(self.tree.body, env, self.functions)
        except FormulaError:
            raise
        except Exception as exc:  # ZeroDivisionError, overflow, a NumPy shape error
            raise FormulaError(f"formula {self.text!r} failed: {type(exc).__name__}: {exc}") from None

    def int_value(self, env: Mapping[str, Any]) -> int:
        """The value as an int; a non-integral result is an error, not silently truncated."""
        value = self(env)
        if isinstance(value, (bool, np.bool_)):
            raise FormulaError(f"formula {self.text!r} gave a boolean, not a number")
        if isinstance(value, (float, np.floating)):
            if not float(value).is_integer():
                raise FormulaError(f"formula {self.text!r} gave {value}, not a whole number (use ceil_div or //)")
            value = int(value)
        if not isinstance(value, (int, np.integer)):
            raise FormulaError(f"formula {self.text!r} gave {type(value).__name__}, not a number")
        return int(value)


def parse(text: Any, *, allowed_names: Iterable[str] | None = None,
          functions: Mapping[str, Callable[..., Any]] = SCALAR_FUNCTIONS) -> Formula:
    """Parse ``text`` (a str, or an int/float constant) into a :class:`Formula`.

    ``allowed_names``: where given, any other free name is an error now rather than at the call.
    """
    if isinstance(text, bool):
        raise FormulaError(f"a formula must be a number or an expression string, got {text!r}")
    if isinstance(text, (int, float)):
        text = repr(text)
    if not isinstance(text, str) or not text.strip():
        raise FormulaError(f"a formula must be a number or a non-empty expression string, got {text!r}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise FormulaError(f"formula {text!r} is not an expression: {exc.msg}") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        _check_node(node, text, functions)
        if isinstance(node, ast.Name) and not _is_called(tree, node):
            names.add(node.id)
    if allowed_names is not None:
        unknown = sorted(names - set(allowed_names))
        if unknown:
            raise FormulaError(f"formula {text!r} uses unknown name(s) {', '.join(unknown)}; "
                               f"known: {', '.join(sorted(allowed_names))}")
    return Formula(text.strip(), tree, frozenset(names), functions)


_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp, ast.Call,
                  ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.And, ast.Or, ast.keyword,
                  *_BINOPS, *_UNARY, *_COMPARE)


def _check_node(node: ast.AST, text: str, functions: Mapping[str, Any]) -> None:
    if not isinstance(node, _ALLOWED_NODES):
        raise FormulaError(f"formula {text!r}: {type(node).__name__} is not allowed in a declaration "
                           "(numbers, names, arithmetic, comparisons, 'a if c else b' and calls of "
                           f"{', '.join(sorted(functions))})")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
        raise FormulaError(f"formula {text!r}: only numeric constants are allowed, got {node.value!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in functions:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise FormulaError(f"formula {text!r}: unknown function {name!r}; "
                               f"known: {', '.join(sorted(functions))}")


def _is_called(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))


def _eval(node: ast.AST, env: Mapping[str, Any], functions: Mapping[str, Callable[..., Any]]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_eval(node.left, env, functions), _eval(node.right, env, functions))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env, functions))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, functions)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, env, functions)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, env, functions) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.IfExp):
        branch = node.body if _eval(node.test, env, functions) else node.orelse
        return _eval(branch, env, functions)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env, functions) for e in node.elts)
    if isinstance(node, ast.Call):
        args = [_eval(a, env, functions) for a in node.args]
        kwargs = {k.arg: _eval(k.value, env, functions) for k in node.keywords}
        return functions[node.func.id](*args, **kwargs)
    raise FormulaError(f"cannot evaluate {type(node).__name__}")  # _check_node keeps this unreachable
