"""How a benchmark leaves its results: ``<name>.json`` (the data) and ``<name>.md`` (the report)."""

from __future__ import annotations

import json
from pathlib import Path


def write(out, name: str, data: dict, markdown: str) -> None:
    """Write ``out/<name>.json`` and ``out/<name>.md`` and print the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    (out / f"{name}.md").write_text(markdown)
    print(markdown)
