"""Every ComputeBackend op's cases (see shared/reference/compute-backend.md), in report order:
the LLM ops (llm_ops.py, with matmul_f16.py) and the backend API around them (backend_api.py)."""

from __future__ import annotations

from .backend_api import BACKEND_API_CASES
from .base import Case
from .llm_ops import LLM_OP_CASES

BACKEND_CASES: tuple[Case, ...] = LLM_OP_CASES + BACKEND_API_CASES
