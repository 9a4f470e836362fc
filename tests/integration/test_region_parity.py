"""Feature parity across two regions' online stores: the world's, and a copy of it (a region materialized from the
same offline data), before and after one entity's stored features change in the copy."""

from __future__ import annotations

import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from feature_repo import store as feature_store
from flows.region_parity import compare_regions, main, sample_keys, stored_features
from tests.world import World, copy_home

pytestmark = pytest.mark.slow
RUNTIME = frozenset(
    {"prefect", "prefect-server", "inference_log", "reports", "batch", "gateways", "prometheus", "logs"}
)


@pytest.fixture
def other_home(world: World):
    home = Path(tempfile.mkdtemp(prefix="tollfree-test-"))  # as long as the world's folder
    copy_home(world.home, home, RUNTIME)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_regions_materialized_from_the_same_data_agree_and_a_changed_entity_is_counted(world: World, other_home):
    here = feature_store.open_store(world.home)
    there = feature_store.open_store(other_home)
    same = compare_regions(here, there, "fraud_v1", sample=50, seed=1)
    assert same.rows == 50 and same.mismatched() == [] and len(same.features) >= 3
    assert main(["--other-home", str(other_home), "--sample", "50", "--seed", "1"]) == 0

    refs, _, sources = stored_features(there, "fraud_v1")
    view, feature = refs[0].split(":")
    key = there.get_feature_view(view).entity_columns[0].name
    first = sample_keys(here, sources, 50, 1)[key].iloc[0]  # an entity the comparison samples
    whole_view = [r for r in refs if r.startswith(f"{view}:")]
    row = there.get_online_features(features=whole_view, entity_rows=[{key: first}]).to_df()
    row[feature] = row[feature] + 1
    row[there.get_feature_view(view).batch_source.timestamp_field] = pd.Timestamp(datetime.now(UTC))
    there.write_to_online_store(view, row)

    changed = compare_regions(here, there, "fraud_v1", sample=50, seed=1)
    counts = {f["feature"]: f["mismatches"] for f in changed.table()}
    assert counts[feature] >= 1 and sum(counts.values()) == counts[feature], counts
    assert main(["--other-home", str(other_home), "--sample", "50", "--seed", "1"]) == 1
