"""``python -m serving.state upgrade|current``: migrate the state store named by ``TOLLFREE_STATE_URL``
(default: ``endpoints.db`` in ``TOLLFREE_HOME``) to this version's schema, or print its revision."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    from serving.settings import Settings
    from serving.state import migrate
    from serving.state.database import StateStoreError, open_database

    parser = argparse.ArgumentParser(prog="python -m serving.state", description=__doc__)
    parser.add_argument("action", choices=["upgrade", "current"])
    args = parser.parse_args(argv)
    try:
        database = open_database(Settings.from_environ(os.environ).state_url)
        if args.action == "current":
            print(f"{database.shown}: revision {migrate.current(database) or 'none'} (this tollfree: {migrate.head()})")
            return 0
        before, after = migrate.upgrade(database)
    except StateStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"error: the state store did not answer: {database.reason(exc)}", file=sys.stderr)
        return 2
    print(f"{database.shown}: revision {before or 'none'} -> {after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
