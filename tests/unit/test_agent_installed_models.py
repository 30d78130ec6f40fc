"""Per-model stores (agent/installed_models.py) and the memory budget (agent/memory_budget.py), on
files only: the migration of a single-model data dir (and one interrupted half way), the
per-model fail-closed floor, and the budget's arithmetic and message."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from edgesdk.agent.installed_models import InstalledModels, check_model_name
from edgesdk.agent.memory_budget import ModelRamBudget, ModelRamBudgetError, bundle_load_mb
from edgesdk.agent.rollback_floor import FLOOR_FILE, KIND_ADVANCE, FloorRecord, RecordFile

from edgesdk.errors import AgentError, RollbackFloorUnknownError


def legacy_data_dir(data_dir: Path, name: str = "digits", release: int = 2) -> Path:
    """What a single-model agent left: store.json, a committed slot, the floor, an update record."""
    (data_dir / "slots" / "a").mkdir(parents=True)
    (data_dir / "slots" / "b").mkdir(parents=True)
    (data_dir / "slots" / "a" / "bundle.edgepkg").write_bytes(b"encrypted bundle")
    state = {
        "active": "a",
        "previous": None,
        "committed": True,
        "slots": {"a": {"name": name, "version": "2.0.0", "release": release, "good": True}},
    }
    (data_dir / "store.json").write_text(json.dumps(state))
    RecordFile(data_dir / FLOOR_FILE).append(FloorRecord(KIND_ADVANCE, release))
    (data_dir / "ota").mkdir()
    (data_dir / "ota" / "state.json").write_text('{"state": "COMMITTED"}')
    (data_dir / "ota" / "command_sequence.json").write_text("{}")
    return data_dir


def test_a_single_model_data_dir_moves_into_its_model_directory(tmp_path: Path) -> None:
    data = legacy_data_dir(tmp_path / "data")
    stores = InstalledModels(data)
    assert stores.migrated == "digits" and stores.default == "digits" and stores.names() == ["digits"]
    model = data / "models" / "digits"
    for item in ("slots/a/bundle.edgepkg", "store.json", FLOOR_FILE, "ota/state.json"):
        assert (model / item).exists(), item
        assert not (data / item).exists(), item
    assert (data / "ota" / "command_sequence.json").exists()  # the device's one sequence ledger stays
    store = stores.store("digits")
    assert store.active_slot == "a" and store.committed and store.rollback_floor() == 2
    assert InstalledModels(data).migrated is None  # nothing left to move at the next start


def test_a_migration_interrupted_half_way_is_finished_at_the_next_start(tmp_path: Path) -> None:
    data = legacy_data_dir(tmp_path / "data")
    staging = data / "models" / ".migrating-digits"
    staging.mkdir(parents=True)
    (data / "slots").rename(staging / "slots")  # the crash came after the first rename
    stores = InstalledModels(data)
    assert stores.migrated == "digits"
    assert not staging.exists()
    assert stores.store("digits").rollback_floor() == 2
    assert (data / "models" / "digits" / "slots" / "a" / "bundle.edgepkg").exists()


def test_a_migration_never_overwrites_a_model_directory(tmp_path: Path) -> None:
    data = legacy_data_dir(tmp_path / "data")
    (data / "models" / "digits").mkdir(parents=True)
    with pytest.raises(AgentError, match="exists already"):
        InstalledModels(data)
    assert (data / "store.json").exists()  # untouched


def test_each_model_has_its_own_floor_and_a_lost_one_fails_closed(tmp_path: Path) -> None:
    data = legacy_data_dir(tmp_path / "data")
    stores = InstalledModels(data)
    other = stores.store("kws")
    assert other.rollback_floor() is None  # a model never installed here has no floor
    # digits' directory is lost whole: the index still says it committed, so installs are refused.
    import shutil

    shutil.rmtree(data / "models" / "digits")
    fresh = InstalledModels(data)
    with pytest.raises(RollbackFloorUnknownError, match="digits"):
        fresh.store("digits").rollback_floor()
    assert fresh.store("kws").rollback_floor() is None


@pytest.mark.parametrize("name", ["", "../etc", "Digits", "a/b", "x" * 65, ".hidden", "a..b"])
def test_model_names_that_cannot_be_a_directory_are_refused(name: str) -> None:
    with pytest.raises(AgentError, match="model name"):
        check_model_name(name)


def variant(precision: str, size_mb: float, load_mb: float | None, passed: bool = True, role: str | None = None):
    accuracy = SimpleNamespace(passed=passed)
    return SimpleNamespace(
        precision=precision, size=int(size_mb * 2**20), load_rss_mb=load_mb, accuracy=accuracy, ladder_role=role
    )


def manifest(*variants):
    return SimpleNamespace(model=SimpleNamespace(name="kws", version="1.0.0"), variants=list(variants))


def test_a_bundles_load_size_counts_one_variant_per_precision_that_may_serve() -> None:
    bundle = manifest(
        variant("fp32", 10, 40.0),
        variant("fp32", 10, 55.0),  # another runtime's fp32: the largest of the precision counts
        variant("int8", 3, None),  # no measurement: its plaintext size
        variant("fp16", 5, 99.0, passed=False),  # failed its gate: never loaded
        variant("fp16", 5, 99.0, role="off"),  # unvalidated: never loaded
    )
    assert bundle_load_mb(bundle) == pytest.approx(58.0)


def test_the_budget_refuses_with_the_figures_in_one_line() -> None:
    budget = ModelRamBudget(100, "rpi-test")
    budget.check(manifest(variant("fp32", 1, 60.0)), {"digits": 40.0})  # exactly fits
    with pytest.raises(ModelRamBudgetError) as refused:
        budget.check(manifest(variant("fp32", 1, 60.5)), {"digits": 40.0})
    message = str(refused.value)
    assert "\n" not in message
    for figure in ("needs 60.5 MB", "only 60.0 MB", "100 MB model budget of profile rpi-test", "digits 40.0 MB"):
        assert figure in message
