"""Reports over kbench results: tables, regression compare, plots. Reads results only."""

from .build import write_report
from .compare import Comparison, compare
from .render import render_table
from .tables import (
    correctness_long, correctness_matrix, devices_table, failures_table, performance_long,
    performance_matrix, queue_config_long, queue_config_matrix, runs_table, status_counts,
)

__all__ = [
    "Comparison", "compare", "correctness_long", "correctness_matrix", "devices_table",
    "failures_table", "performance_long", "performance_matrix", "queue_config_long",
    "queue_config_matrix", "render_table", "runs_table", "status_counts", "write_report",
]
