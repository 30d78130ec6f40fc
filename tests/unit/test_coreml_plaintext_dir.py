"""Core ML's decrypted package goes to a memory-backed directory or nowhere (no Core ML needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.errors import BackendUnavailableError
from edgesdk.runtimes.plaintext_dir import choose_plaintext_dir, filesystem_type, parse_mounts

PROC_MOUNTS = """\
/dev/mmcblk0p2 / ext4 rw,noatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
tmpfs /run/user/1000 tmpfs rw,nosuid,nodev,size=1000k 0 0
/dev/sda1 /mnt/with\\040space vfat rw 0 0
"""
MACOS_MOUNT = """\
/dev/disk3s1s1 on / (apfs, sealed, local, read-only, journaled)
devfs on /dev (devfs, local, nobrowse)
/dev/disk4 on /Volumes/RAM Disk (hfs, local, nodev, nosuid, noowners)
"""


def test_mount_tables_of_linux_and_macos_parse() -> None:
    assert ("/dev/shm", "tmpfs") in parse_mounts(PROC_MOUNTS)
    assert ("/mnt/with space", "vfat") in parse_mounts(PROC_MOUNTS)
    assert ("/Volumes/RAM Disk", "hfs") in parse_mounts(MACOS_MOUNT)
    assert filesystem_type(Path("/run/user/1000/x"), parse_mounts(PROC_MOUNTS)) == "tmpfs"
    assert filesystem_type(Path("/run/user/10000"), parse_mounts(PROC_MOUNTS)) == "ext4"  # not a prefix match


def _mounts_with(tmp_path: Path, kind: str) -> list[tuple[str, str]]:
    return [("/", "ext4"), (str(tmp_path.resolve()), kind)]


def test_a_tmpfs_runtime_dir_is_chosen(tmp_path: Path) -> None:
    chosen = choose_plaintext_dir(
        {}, environ={"XDG_RUNTIME_DIR": str(tmp_path)}, mounts=_mounts_with(tmp_path, "tmpfs")
    )
    assert chosen == tmp_path


def test_a_disk_backed_dir_is_refused_with_every_candidate_named(tmp_path: Path) -> None:
    mounts = [*_mounts_with(tmp_path, "ext4"), ("/dev/shm", "ext4")]  # no /dev/shm tmpfs either
    with pytest.raises(BackendUnavailableError) as caught:
        choose_plaintext_dir({}, environ={"XDG_RUNTIME_DIR": str(tmp_path)}, mounts=mounts)
    message = str(caught.value)
    assert f"{tmp_path} (ext4)" in message and "/dev/shm" in message and "allow_persistent_plaintext" in message


def test_a_configured_dir_must_be_memory_backed_too(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailableError, match="plaintext_dir"):
        choose_plaintext_dir({"plaintext_dir": str(tmp_path)}, environ={}, mounts=_mounts_with(tmp_path, "apfs"))
    assert choose_plaintext_dir({"plaintext_dir": str(tmp_path)}, environ={}, mounts=_mounts_with(tmp_path, "ramfs"))


def test_persistent_plaintext_only_by_explicit_opt_in(tmp_path: Path) -> None:
    chosen = choose_plaintext_dir(
        {"plaintext_dir": str(tmp_path), "allow_persistent_plaintext": "true"},
        environ={},
        mounts=_mounts_with(tmp_path, "ext4"),
    )
    assert chosen.is_dir()


def test_the_real_dev_shm_is_found_where_linux_has_it() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or filesystem_type(shm, parse_mounts(Path("/proc/self/mounts").read_text())) != "tmpfs":
        pytest.skip("this machine has no tmpfs /dev/shm")
    assert choose_plaintext_dir({}, environ={}) == shm
