"""`python -m kbench.results`: rewrite the shipped JSON Schema (schema.json) from schema.py."""

import json
from pathlib import Path

from .schema import json_schema

target = Path(__file__).with_name("schema.json")
target.write_text(json.dumps(json_schema(), indent=1) + "\n")
print(f"wrote {target}")
