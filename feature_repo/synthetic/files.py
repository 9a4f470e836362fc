"""The data set on disk: one parquet file per table, each written atomically."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pandas as pd

from feature_repo.synthetic.config import SyntheticData

logger = logging.getLogger(__package__)

CUSTOMERS_FILE = "customers.parquet"
MERCHANTS_FILE = "merchants.parquet"
TRANSACTIONS_FILE = "transactions.parquet"


def write_parquet_atomic(frame: pd.DataFrame, path: Path, row_group_size: int | None = None) -> None:
    """Write a parquet file so a reader sees the old file or the new one, never half of one."""
    # A unique sibling name rather than mkstemp, so the file gets the usual
    # umask-based permissions instead of mkstemp's 0600.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        frame.to_parquet(tmp, index=False, row_group_size=row_group_size)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write(data: SyntheticData, folder: Path) -> dict[str, Path]:
    """Write the three tables as parquet files into ``folder``, each atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tables = {
        "customers": (data.customers, folder / CUSTOMERS_FILE),
        "merchants": (data.merchants, folder / MERCHANTS_FILE),
        "transactions": (data.transactions, folder / TRANSACTIONS_FILE),
    }
    for name, (frame, path) in tables.items():
        write_parquet_atomic(frame, path)
        logger.debug("wrote %s (%d rows) to %s", name, len(frame), path)
    return {name: path for name, (_, path) in tables.items()}


def read_transactions(folder: Path) -> pd.DataFrame:
    """Read ``transactions.parquet`` from ``folder``."""
    path = Path(folder) / TRANSACTIONS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"synthetic transactions not found at {path}; generate them with "
            f"`python -m feature_repo.synthetic --out {Path(folder)}`"
        )
    return pd.read_parquet(path)
