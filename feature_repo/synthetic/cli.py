"""``python -m feature_repo.synthetic --out FOLDER``: generate a data set and write it."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from feature_repo.synthetic.config import SyntheticConfig
from feature_repo.synthetic.files import write
from feature_repo.synthetic.generator import generate

logger = logging.getLogger(__package__)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = SyntheticConfig()
    parser = argparse.ArgumentParser(
        prog="python -m feature_repo.synthetic",
        description="Generate a synthetic card-payment fraud data set as parquet files.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--customers", type=int, default=defaults.n_customers)
    parser.add_argument("--merchants", type=int, default=defaults.n_merchants)
    parser.add_argument("--days", type=int, default=defaults.days)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--txns-per-day",
        type=float,
        default=defaults.mean_txns_per_customer_day,
        help="mean transactions per customer and day",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _parse_args(argv)
    try:
        config = SyntheticConfig(
            n_customers=args.customers,
            n_merchants=args.merchants,
            days=args.days,
            seed=args.seed,
            mean_txns_per_customer_day=args.txns_per_day,
        )
    except ValueError as exc:
        logger.error("invalid configuration: %s", exc)
        return 2
    data = generate(config)
    paths = write(data, args.out)
    txns = data.transactions
    positives = int(txns["is_fraud"].sum())
    logger.info(
        "customers=%d merchants=%d transactions=%d positives=%d (%.2f%%)",
        len(data.customers),
        len(data.merchants),
        len(txns),
        positives,
        100.0 * positives / max(len(txns), 1),
    )
    for name, path in paths.items():
        logger.info("%s -> %s", name, path)
    return 0
