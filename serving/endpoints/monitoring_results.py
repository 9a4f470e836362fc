"""An endpoint's latest skew and drift verdict, where the gateway can read it: a JSON file per endpoint under
``$TOLLFREE_HOME/monitoring/``, written atomically by the skew and drift flow (``flows.skew``) at the end of each
run that compared data, and read by the console (its flag and page) and the gateway's metrics
(``tollfree_drift_findings``, which the alerting rules watch)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

MAX_FINDINGS = 50


def results_file(home: Path, endpoint: str) -> Path:
    return home / "monitoring" / f"{quote(endpoint, safe='')}.json"


def save_latest(home: Path, summary: Mapping[str, Any], at: datetime) -> None:
    """The run's verdict (``clean`` or ``findings``), its findings, and per served version its drift share, the
    drifted columns and the report's path."""
    versions = {
        label: {key: entry.get(key) for key in ("rows", "drift_share", "drifted", "parity_mismatched", "report")}
        for label, entry in (summary.get("versions") or {}).items()
    }
    record = {
        "endpoint": summary["endpoint"],
        "verdict": summary["verdict"],
        "findings": list(summary.get("findings") or [])[:MAX_FINDINGS],
        "rows": summary.get("rows"),
        "versions": versions,
        "at": at.isoformat(),
    }
    path = results_file(home, str(summary["endpoint"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record, indent=1, default=str))
    os.replace(temporary, path)


def load_latest(home: Path, endpoint: str) -> dict[str, Any] | None:
    """The latest verdict recorded for ``endpoint``; None when no run compared data yet, or the file is unreadable."""
    try:
        found = json.loads(results_file(home, endpoint).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
