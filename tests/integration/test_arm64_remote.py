"""``scripts/test-arm64 --on-device HOST``: the working tree goes to the board over ssh (its venv
kept, stale files gone) and the lane runs there with --on-device and the same arguments. Here
"ssh" is a stand-in that runs the remote command on this machine, in a fresh HOME; this machine
is not an arm64 board, so the lane there stops at its first check, which says so."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_on_device_over_ssh_copies_the_tree_and_runs_the_lane_there(tmp_path) -> None:
    board_home = tmp_path / "board"
    lane = board_home / "lane"
    (lane / ".venv" / "bin").mkdir(parents=True)
    (lane / ".venv" / "bin" / "python").symlink_to(Path(os.sys.executable))  # the board's venv, from before
    (lane / "stale.txt").write_text("a file from an older checkout")
    calls = tmp_path / "ssh-calls"
    fake_ssh = tmp_path / "fake-ssh"
    fake_ssh.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$1" >> {calls}\n'
        f'echo "$2" >> {calls}.commands\n'
        f'cd {board_home} && HOME={board_home} exec bash -c "$2"\n'
    )
    fake_ssh.chmod(0o755)
    env = {**os.environ, "EDGESDK_SSH": str(fake_ssh), "EDGESDK_REMOTE_DIR": "lane"}
    proc = subprocess.run(
        [str(REPO / "scripts/test-arm64"), "--on-device", "pi@pi5.local", "-k", "heat"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert calls.read_text().split() == ["pi@pi5.local", "pi@pi5.local"]  # copy, then run
    assert (lane / "scripts" / "test-arm64").is_file() and (lane / "agent" / "daemon.py").is_file()
    assert (lane / ".venv" / "bin" / "python").exists() and not (lane / "stale.txt").exists()
    assert "==> running the lane on pi@pi5.local" in out
    assert "scripts/test-arm64 --on-device --suite bookworm -k heat" in Path(f"{calls}.commands").read_text()
    machine = os.uname().machine
    if machine != "aarch64":
        # The lane ran there with --on-device, and stopped at its board check.
        assert f"--on-device runs on an aarch64 board; this is {machine}" in out, out
        assert proc.returncode == 1 and "finished (rc 1)" in out


def test_a_pytest_argument_after_on_device_is_not_taken_for_a_host(tmp_path) -> None:
    env = {**os.environ, "EDGESDK_SSH": str(tmp_path / "no-ssh-here")}
    proc = subprocess.run(
        [str(REPO / "scripts/test-arm64"), "--on-device", "-k", "heat"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "copying the working tree" not in proc.stdout
    if os.uname().machine != "aarch64" and os.geteuid() == 0:
        assert "--on-device runs on an aarch64 board" in proc.stderr
