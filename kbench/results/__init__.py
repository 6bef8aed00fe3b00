"""Result schema (versioned), the JSONL run store and run provenance. Plain data: no Vulkan."""

from .provenance import collect_provenance, device_identity, git_revision, make_run_id, utc_now
from .schema import (
    KNOWN_BACKENDS, MODES, PEAK_UNITS, SCHEMA_VERSION, STATUSES, RecordError, make_case_id,
    make_device_key, validate_record,
)
from .store import (
    ResultsFormatError, ResultsWarning, RunWriter, flatten_record, load_run_headers, load_runs,
    read_run_file, result_files,
)

__all__ = [
    "KNOWN_BACKENDS", "MODES", "PEAK_UNITS", "SCHEMA_VERSION", "STATUSES", "RecordError",
    "ResultsFormatError", "ResultsWarning", "RunWriter", "collect_provenance", "device_identity",
    "flatten_record", "git_revision", "load_run_headers", "load_runs", "make_case_id",
    "make_device_key", "make_run_id", "read_run_file", "result_files", "utc_now", "validate_record",
]
