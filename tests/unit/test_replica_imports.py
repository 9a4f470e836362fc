"""The replica process imports Feast without typeguard's instrumentation, and says when it is too late."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
from serving.replica_server.imports import _unchecked, skip_feast_type_checks
assert skip_feast_type_checks()
import feast.feature_service
assert feast.feature_service.typechecked is _unchecked
assert not skip_feast_type_checks()   # Feast is imported: too late, nothing done
"""


def test_feast_imported_after_the_skip_gets_the_no_op_decorator():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
