"""Prefect flows: thin orchestration over feature_repo, serving and monitoring.

The one import-time action in the project: before Prefect, MLflow or Feast are imported by any flow
module, fill in (never override) telemetry-off switches and the state-folder paths those libraries
read from the environment once, at their own import.
"""

from __future__ import annotations

import os

from serving.settings import export_defaults

export_defaults(os.environ)
