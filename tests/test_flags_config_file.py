"""``enable`` / ``disable`` edits of the config file: refusals, in-place edits, atomic writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from flags import FLAG_SPECS, FlagError, disable, enable, plan_change, resolve_flags, write_atomic
from phases import PhaseId

CP_ON = "enable-nsa-prefill-context-parallel = true\nattn-cp-size = 4\n"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for spec in FLAG_SPECS.values():
        monkeypatch.delenv(spec.env, raising=False)
    monkeypatch.delenv("CPKV_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "cpkv.toml"
    path.write_text("# deployment of cluster a\n" + CP_ON + "page-size = 64  # NSA\n")
    return path


def enabled(path: Path) -> set[int]:
    return {int(p) for p in resolve_flags(path).flags.enabled_phases()}


def test_enable_appends_the_phase_key_and_keeps_comments(config: Path) -> None:
    before = config.read_text()
    change = enable(config, PhaseId.NARROW_OUTPUT)
    assert change.applied and not change.refused
    assert config.read_text() == before + "enable-nsa-prefill-cp-narrow-output = true\n"
    assert enabled(config) == {1}


def test_enable_refuses_a_phase_whose_need_is_off_and_leaves_file_identical(
    config: Path,
) -> None:
    before = config.read_bytes()
    change = enable(config, PhaseId.CURRENT_REUSE)
    assert change.refused and not change.applied
    assert change.reasons == ("NEEDS_DISABLED phase=3 needs=2",)
    assert "--with-needs" in change.hint
    assert config.read_bytes() == before
    assert change.enabled_after == frozenset()
    assert change.to_json()["enabled_phases"] == []


def test_a_problem_already_in_the_file_does_not_block_a_change(config: Path) -> None:
    """Only problems the change adds refuse it (module docstring of ``flags.config_file``)."""
    config.write_text(CP_ON + "shadow-rate = 2.0\n")
    change = enable(config, PhaseId.NARROW_OUTPUT)
    assert change.applied and change.reasons == ()
    assert config.read_text() == CP_ON + "shadow-rate = 2.0\n" + (
        "enable-nsa-prefill-cp-narrow-output = true\n"
    )
    assert enabled(config) == {1}


def test_enable_with_needs_turns_on_the_whole_closure(config: Path) -> None:
    change = enable(config, PhaseId.COMPUTE_OWNER_WRITE, with_needs=True)
    assert change.applied
    assert set(change.writes) == {
        "enable-nsa-prefill-cp-shared-kv",
        "enable-nsa-prefill-cp-page-aligned-split",
        "enable-nsa-prefill-cp-compute-owner-write",
    }
    assert enabled(config) == {2, 4, 5}


def test_enable_allows_compute_owner_write_with_round_robin(config: Path) -> None:
    config.write_text(CP_ON + "nsa-prefill-cp-mode = 'round-robin-split'\n")
    change = enable(config, PhaseId.COMPUTE_OWNER_WRITE, with_needs=True)
    assert change.applied and change.reasons == ()
    assert enabled(config) == {2, 4, 5}


def test_enable_refuses_while_cp_is_off_with_every_reason(tmp_path: Path) -> None:
    path = tmp_path / "fresh.toml"
    change = enable(path, PhaseId.CURRENT_REUSE)
    assert change.reasons == ("PHASE_WITHOUT_CP phase=3", "NEEDS_DISABLED phase=3 needs=2")
    assert "enable-nsa-prefill-context-parallel = true" in change.hint
    assert not path.exists()


def test_enable_creates_a_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPKV_ENABLE_NSA_PREFILL_CONTEXT_PARALLEL", "1")
    path = tmp_path / "new.toml"
    change = enable(path, PhaseId.SHARDED_KV)
    assert change.applied and change.old_text is None
    assert path.read_text().endswith("\nenable-nsa-prefill-cp-shared-kv = true\n")
    assert path.read_text().startswith("# cpkv flags")


def test_enable_of_an_enabled_phase_writes_nothing(config: Path) -> None:
    enable(config, PhaseId.NARROW_OUTPUT)
    stamp = config.stat().st_mtime_ns
    change = enable(config, PhaseId.NARROW_OUTPUT)
    assert not change.applied and not change.refused and change.writes == {}
    assert config.stat().st_mtime_ns == stamp


def test_disable_refuses_while_an_enabled_phase_needs_it(config: Path) -> None:
    enable(config, PhaseId.CURRENT_REUSE, with_needs=True)
    before = config.read_bytes()
    change = disable(config, PhaseId.SHARDED_KV)
    assert change.reasons == ("NEEDS_DISABLED phase=3 needs=2",)
    assert "--cascade" in change.hint
    assert config.read_bytes() == before


def test_disable_cascade_turns_off_the_dependents_in_place(config: Path) -> None:
    enable(config, PhaseId.COMPUTE_OWNER_WRITE, with_needs=True)
    enable(config, PhaseId.NARROW_OUTPUT)
    lines_before = config.read_text().count("\n")
    change = disable(config, PhaseId.SHARDED_KV, cascade=True)
    assert change.applied and enabled(config) == {1}
    assert config.read_text().count("\n") == lines_before
    assert "enable-nsa-prefill-cp-compute-owner-write = false" in config.read_text()


def test_edit_keeps_trailing_comments_and_unrelated_keys(config: Path) -> None:
    line = "enable-nsa-prefill-cp-narrow-output = {}  # off for now\n"
    config.write_text(CP_ON + line.format("false"))
    enable(config, PhaseId.NARROW_OUTPUT)
    assert config.read_text() == CP_ON + line.format("true")


def test_edit_sets_a_quoted_key_in_place(config: Path) -> None:
    """TOML allows a quoted key; the edit replaces its value instead of adding a duplicate."""
    line = '"enable-nsa-prefill-cp-narrow-output" = {}  # quoted\n'
    config.write_text(CP_ON + line.format("false"))
    change = enable(config, PhaseId.NARROW_OUTPUT)
    assert change.applied
    assert config.read_text() == CP_ON + line.format("true")
    assert enabled(config) == {1}


def test_refused_and_allowed_changes_leave_no_temp_files(config: Path) -> None:
    enable(config, PhaseId.CURRENT_REUSE)
    enable(config, PhaseId.CURRENT_REUSE, with_needs=True)
    disable(config, PhaseId.SHARDED_KV)
    assert sorted(p.name for p in config.parent.iterdir()) == ["cpkv.toml"]


def test_failed_write_keeps_the_old_file_and_removes_the_temp(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = config.read_bytes()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("flags.config_file.os.replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        enable(config, PhaseId.NARROW_OUTPUT)
    assert config.read_bytes() == before
    assert sorted(p.name for p in config.parent.iterdir()) == ["cpkv.toml"]


def test_atomic_write_keeps_the_file_mode_and_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "real.toml"
    target.write_text("page-size = 4\n")
    os.chmod(target, 0o600)
    link = tmp_path / "link.toml"
    link.symlink_to(target)
    write_atomic(link, "page-size = 8\n")
    assert link.is_symlink() and target.read_text() == "page-size = 8\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_env_override_is_noted(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT", "0")
    change = enable(config, PhaseId.NARROW_OUTPUT)
    assert change.applied
    assert change.notes == (
        "env:CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT overrides the file: phase 1 stays off",
    )


def test_ceiling_above_the_phase_is_noted(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPKV_MAX_PHASE", "1")
    change = plan_change(config, "enable", PhaseId.SHARDED_KV, False)
    assert not change.refused
    assert change.notes == ("CPKV_MAX_PHASE=1 keeps phases above 1 inactive",)


def test_malformed_file_is_bad_input_not_a_refusal(config: Path) -> None:
    config.write_text("page-size = 'big'\n")
    with pytest.raises(FlagError, match=r"cpkv\.toml: key 'page-size' must be an integer"):
        enable(config, PhaseId.NARROW_OUTPUT)


def test_creating_in_a_missing_directory_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(FlagError, match=r"directory .* does not exist"):
        enable(tmp_path / "nope" / "cpkv.toml", PhaseId.NARROW_OUTPUT)
