"""Result records (constructors, case ids), their versioned schema, the JSONL run store and run
provenance. Plain data: no Vulkan."""

from .provenance import collect_provenance, device_identity, git_revision, make_run_id, utc_now
from .records import (
    IMPLEMENTATION_OF_BACKEND, CaseId, case_error, case_name, case_record, implementation_of, make_case_id,
    parse_case_id, peak_record,
)
from .schema import (
    KNOWN_BACKENDS, MODES, PEAK_UNITS, SCHEMA_VERSION, STATUSES, RecordError, make_device_key,
    validate_record,
)
from .store import (
    ResultsFormatError, ResultsWarning, RunWriter, flatten_record, load_run_headers, load_runs,
    read_run_file, result_files,
)

__all__ = [
    "IMPLEMENTATION_OF_BACKEND", "CaseId", "case_error", "case_name", "case_record", "implementation_of",
    "parse_case_id", "peak_record",
    "KNOWN_BACKENDS", "MODES", "PEAK_UNITS", "SCHEMA_VERSION", "STATUSES", "RecordError",
    "ResultsFormatError", "ResultsWarning", "RunWriter", "collect_provenance", "device_identity",
    "flatten_record", "git_revision", "load_run_headers", "load_runs", "make_case_id",
    "make_device_key", "make_run_id", "read_run_file", "result_files", "utc_now", "validate_record",
]
