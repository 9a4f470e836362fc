"""The batch output's staging and one-rename publish, on a real filesystem."""

from __future__ import annotations

import pytest

from serving.batch import output_layout
from serving.batch.chunks import plan_chunks
from serving.batch.input_check import InputFile, InputPlan


def _stage(root, run_id: str, text: str):
    staging = output_layout.new_staging(root, run_id)
    part = output_layout.part_path(staging, "3", "2026-11-01", 0)
    part.parent.mkdir(parents=True)
    part.write_text(text)
    output_layout.write_manifest(staging, {"run_id": run_id, "text": text})
    return staging


def test_publish_moves_a_complete_run_into_place_in_one_step(tmp_path):
    staging = _stage(tmp_path, "r1", "first")
    final = output_layout.run_dir(tmp_path, "r1")
    output_layout.publish(staging, final)
    assert not staging.exists()
    assert (final / "version=3" / "date=2026-11-01" / "part-000000.parquet").read_text() == "first"
    assert output_layout.read_manifest(final)["text"] == "first"


def test_republishing_a_run_id_swaps_it_and_leaves_other_runs_alone(tmp_path):
    output_layout.publish(_stage(tmp_path, "r1", "old"), output_layout.run_dir(tmp_path, "r1"))
    output_layout.publish(_stage(tmp_path, "r2", "other"), output_layout.run_dir(tmp_path, "r2"))
    staging = _stage(tmp_path, "r1", "new")
    output_layout.publish(staging, output_layout.run_dir(tmp_path, "r1"))
    assert output_layout.read_manifest(tmp_path / "run=r1")["text"] == "new"
    assert output_layout.read_manifest(tmp_path / "run=r2")["text"] == "other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run=r1", "run=r2"]  # the swapped-out old run is deleted


def test_a_new_staging_dir_clears_leftovers_of_its_own_run_id_only(tmp_path):
    killed = _stage(tmp_path, "r1", "killed")
    other = _stage(tmp_path, "r10", "running")
    fresh = output_layout.new_staging(tmp_path, "r1")
    assert not killed.exists() and other.exists() and fresh.exists()
    assert fresh.name.startswith(".")  # hidden from parquet readers


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 129, "a b"])
def test_run_ids_are_single_safe_path_segments(bad):
    with pytest.raises(ValueError, match="run id"):
        output_layout.check_run_id(bad)


def test_chunks_cut_row_groups_in_input_order():
    plan = InputPlan("in", (InputFile("a.parquet", (5, 2)), InputFile("b.parquet", (3,))))
    chunks = plan_chunks(plan, 2)
    assert [(c.path, c.row_group, c.start, c.length) for c in chunks] == [
        ("a.parquet", 0, 0, 2),
        ("a.parquet", 0, 2, 2),
        ("a.parquet", 0, 4, 1),
        ("a.parquet", 1, 0, 2),
        ("b.parquet", 0, 0, 2),
        ("b.parquet", 0, 2, 1),
    ]
    assert [c.index for c in chunks] == list(range(6)) and sum(c.length for c in chunks) == 10
