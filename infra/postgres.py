"""The stack's own PostgreSQL, the state store several gateways share (``make up`` with ``TOLLFREE_GATEWAYS`` >= 2).

Debian's server programs (installed when missing, ``infra.packages``) on a data folder of the stack's own,
``TOLLFREE_POSTGRES_DIR`` (default ``$TOLLFREE_HOME/postgres``), created by ``initdb`` on the first ``up``
and kept by ``down``. It listens on 127.0.0.1 only, with password authentication (scram-sha-256) for the
user ``tollfree``; the password is generated once into ``$TOLLFREE_HOME/secrets/postgres-password`` (0600)
and reaches the gateways only through ``TOLLFREE_STATE_URL`` in their environment, never a log or the
output. PostgreSQL refuses to run as root: as root, it runs as the ``postgres`` user, which must be able to
reach the data folder.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra.packages import ensure_postgres

USER = "tollfree"
DATABASE = "tollfree"


def run_as() -> str | None:
    return "postgres" if os.geteuid() == 0 else None


@dataclass(frozen=True)
class StackPostgres:
    folder: Path  # holds data/ (the cluster)
    port: int
    password_file: Path

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def password(self) -> str:
        """The generated password (created 0600 on first use)."""
        self.password_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self.password_file.read_text().strip()
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(24) + "\n")
        return self.password_file.read_text().strip()

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://{USER}:{self.password()}@127.0.0.1:{self.port}/{database}"

    @property
    def shown(self) -> str:
        return f"postgresql://{USER}:***@127.0.0.1:{self.port}/{DATABASE}"

    def command(self) -> list[str]:
        """What runs the server in the foreground (``initialize`` first)."""
        return [
            str(ensure_postgres() / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.data}",
            "-c",
            "max_connections=200",
        ]

    def initialize(self) -> None:
        """Create the cluster if there is none yet."""
        if not (self.data / "PG_VERSION").exists():
            self._initdb(ensure_postgres(), run_as())

    def _initdb(self, bindir: Path, owner: str | None) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if owner is not None:
            shutil.chown(self.folder, owner)
            probe = subprocess.run(["test", "-w", str(self.folder)], user=owner, capture_output=True)
            if probe.returncode != 0:
                raise RuntimeError(
                    f"PostgreSQL runs as the user {owner}, which cannot reach {self.folder}; set "
                    "TOLLFREE_POSTGRES_DIR to a folder it can (every folder above it searchable)"
                )
        with tempfile.NamedTemporaryFile("w", dir=self.folder, prefix=".pw-", delete=False) as pw:
            pw.write(self.password() + "\n")
        try:
            if owner is not None:
                shutil.chown(pw.name, owner)
            done = subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    USER,
                    f"--pwfile={pw.name}",
                    "--auth=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ],
                capture_output=True,
                text=True,
                timeout=300,
                user=owner,
                cwd=str(self.folder),
            )
        finally:
            os.unlink(pw.name)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed for {self.data} (code {done.returncode}): {done.stderr.strip()[-500:]}")

    def answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def create_database(self) -> None:
        """The ``tollfree`` database, if it does not exist yet (the gateways create its tables)."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=5) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
