"""Prometheus for the local stack (``make up``): its configuration (pure) and the files it reads.

It scrapes every 5 s what the gateways list for it (``serving.gateway.scrape_targets``), two jobs over files in
the state folder's ``prometheus/targets/``:

- ``tollfree-gateway``: each gateway's ``/metrics``, with the admin token (a copy in ``secrets/scrape-token``,
  0600, written at each ``make up``: Prometheus reads a token from a file only);
- ``tollfree-replica``: each replica process's ``/metrics``, with the replicas' token (``replica.token``, which
  the gateways create).

It evaluates the rules of ``infra/prometheus/rules.yml`` (recording rules for the endpoints' figures, alerting
rules) and keeps 15 days of samples in ``prometheus/data``. Alerts are evaluated and shown by Prometheus (its
``/alerts`` page and API); no Alertmanager is started, so none is sent anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

RULES = Path(__file__).resolve().parent / "prometheus" / "rules.yml"
SCRAPE_INTERVAL_S = 5
RETENTION = "15d"


def config(targets: Path, admin_token_file: Path, replica_token_file: Path, rules: Path = RULES) -> str:
    """Prometheus's configuration: the two jobs over the gateways' target files in ``targets``, and ``rules``."""
    document = {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": "15s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "tollfree-gateway",
                "authorization": {"credentials_file": str(admin_token_file)},
                "file_sd_configs": [{"files": [str(targets / "*.gateway.json")]}],
            },
            {
                "job_name": "tollfree-replica",
                "authorization": {"credentials_file": str(replica_token_file)},
                "file_sd_configs": [{"files": [str(targets / "*.replicas.json")]}],
            },
        ],
    }
    return "# written by make up (infra/prometheus.py); rewritten at every up\n" + yaml.safe_dump(
        document, sort_keys=False
    )


def command(binary: str, config_file: Path, data: Path, host: str, port: int) -> list[str]:
    return [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address={host}:{port}",
    ]


def write_secret(path: Path, value: str) -> None:
    """``value`` in ``path``, readable by its owner only (created so: never world-readable, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")
