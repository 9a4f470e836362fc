"""The record of what the local stack runs: its id (which marks every process it starts), each service's
process, and how many gateways it runs; ``$TOLLFREE_HOME/stack/stack.json``, replaced atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from infra.processes import ProcessRecord
from infra.stack_config import StackConfig


@dataclass
class StackRecord:
    stack_id: str
    services: dict[str, ProcessRecord]
    gateways: int = 1

    @classmethod
    def load(cls, path: Path) -> StackRecord | None:
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(
            data["stack_id"],
            {s["name"]: ProcessRecord.from_json(s) for s in data["services"]},
            int(data.get("gateways", 1)),
        )

    def save(self, path: Path, config: StackConfig) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "stack_id": self.stack_id,
            "home": str(config.home),
            "ports": config.ports,
            "gateways": config.gateways,
            "services": [r.to_json() for r in self.services.values()],
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)
