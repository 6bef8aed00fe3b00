"""Turning report tables into text: terminal, Markdown, HTML, CSV and JSON."""

from __future__ import annotations

import html
import json
import math
from typing import Any

import pandas as pd
from tabulate import tabulate

FORMATS = ("simple", "github", "md", "html", "csv", "json")

# status words in cells get a CSS class in the HTML report so failures stand out
_STATUS_CLASSES = (("FAIL", "st-fail"), ("error", "st-error"), ("unsupported", "st-unsupported"),
                   ("xfail", "st-xfail"), ("not run", "st-notrun"), ("pass", "st-pass"))


def _flat_index(df: pd.DataFrame) -> pd.DataFrame:
    """Index (or MultiIndex) turned into leading columns; a RangeIndex is dropped."""
    if isinstance(df.index, pd.RangeIndex) and df.index.name is None:
        return df
    return df.reset_index()


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def render_table(df: pd.DataFrame, fmt: str = "simple", floatfmt: str = ".4g") -> str:
    """``df`` as text in one of FORMATS; "md" is GitHub-flavoured Markdown."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown table format {fmt!r}; choose one of {', '.join(FORMATS)}")
    flat = _flat_index(df)
    if fmt == "csv":
        return flat.to_csv(index=False)
    if fmt == "json":
        return json.dumps(table_records(df), indent=1, ensure_ascii=False, default=str)
    if fmt == "html":
        return html_table(df)
    if flat.empty and len(flat.columns) == 0:
        return "(no rows)\n"
    rows = [[_cell(v) for v in row] for row in flat.itertuples(index=False)]
    tablefmt = "github" if fmt in ("github", "md") else "simple"
    headers = [str(c) for c in flat.columns]
    if tablefmt == "github":
        # a "|" inside a cell would end the cell in Markdown
        rows = [[v.replace("|", "\\|") if isinstance(v, str) else v for v in row] for row in rows]
        headers = [h.replace("|", "\\|") for h in headers]
    return tabulate(rows, headers=headers, tablefmt=tablefmt, floatfmt=floatfmt,
                    disable_numparse=False) + "\n"


def table_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready list of row dicts (NaN becomes null)."""
    flat = _flat_index(df)
    out = []
    for row in flat.to_dict("records"):
        out.append({str(k): (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    return out


def _status_class(text: str) -> str:
    for word, css in _STATUS_CLASSES:
        if text == word or text.startswith(word + ":"):
            return css
    return ""


def html_table(df: pd.DataFrame) -> str:
    """A plain <table>; status cells carry st-* classes (pass, FAIL, error, unsupported...)."""
    flat = _flat_index(df)
    if flat.empty and len(flat.columns) == 0:
        return "<p><em>(no rows)</em></p>\n"
    parts = ["<table>\n<thead><tr>"]
    parts += [f"<th>{html.escape(str(c))}</th>" for c in flat.columns]
    parts.append("</tr></thead>\n<tbody>\n")
    for row in flat.itertuples(index=False):
        parts.append("<tr>")
        for value in row:
            value = _cell(value)
            text = f"{value:.4g}" if isinstance(value, float) else str(value)
            css = _status_class(text)
            attr = f' class="{css}"' if css else ""
            parts.append(f"<td{attr}>{html.escape(text)}</td>")
        parts.append("</tr>\n")
    parts.append("</tbody>\n</table>\n")
    return "".join(parts)
