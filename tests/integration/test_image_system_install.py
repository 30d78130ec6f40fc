"""install.sh as root on a device: user ``edgesdk``, owners and modes of the layout, and the
``edge-agent`` wrapper acting as that user — run in a private mount namespace whose /etc,
/opt, /var/lib and /run are scratch copies, so this machine is not changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.image_helpers import require_package_index
from tests.integration.test_image_x86_install import offline_env, write_test_profile

pytestmark = pytest.mark.slow

EXPECTED_LAYOUT = {
    "/etc/edgesdk": "750 root:edgesdk",
    "/etc/edgesdk/agent.toml": "640 root:edgesdk",
    "/etc/edgesdk/profiles": "750 root:edgesdk",
    "/var/lib/edgesdk": "700 edgesdk:edgesdk",
    "/run/edgesdk": "750 edgesdk:edgesdk",
    "/opt/edgesdk": "755 root:root",
    "/etc/systemd/system/edge-agent.service": "644 root:root",
    "/usr/local/bin/edge-agent": "755 root:root",
    # made by `edge-agent key` run as root through the wrapper: owned by the agent's user
    "/var/lib/edgesdk/device.key": "600 edgesdk:edgesdk",
}


def require_root_namespaces() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("useradd") is None:
        pytest.skip("needs root, unshare and useradd (a device-like install in a private mount namespace)")
    probe = subprocess.run(["unshare", "--mount", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")


def system_python() -> str:
    """The OS's Python of this version: the agent's user must be able to run it (not one under /root)."""
    found = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/bin")
    if found is None:
        pytest.skip(f"no system Python {sys.version_info.major}.{sys.version_info.minor} in /usr/bin")
    return found


def private_python() -> str | None:
    """sys.executable when users other than root cannot run it (a directory on its path is closed)."""
    real = Path(os.path.realpath(sys.executable))
    closed = any(not (parent.stat().st_mode & 0o001) for parent in real.parents)
    return sys.executable if closed else None


def test_root_install_creates_the_user_and_layout(tmp_path: Path, edgesdk_cli) -> None:
    require_root_namespaces()
    require_package_index()
    python = system_python()
    profiles = write_test_profile(tmp_path / "profiles")
    image = tmp_path / "image.tar.gz"
    build = edgesdk_cli(
        "--profiles-dir", str(profiles), "image", "build", "--profile", "nuc-py311",
        "--broker", "mqtt://127.0.0.1:1883", "--out", str(image),
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    with tarfile.open(image) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (top,) = (tmp_path / "unpacked").iterdir()

    scratch = tmp_path / "scratch"
    shutil.copytree("/etc", scratch / "etc", symlinks=True, ignore_dangling_symlinks=True)
    for name in ("opt", "varlib", "usrlocal"):
        (scratch / name).mkdir()
        (scratch / name).chmod(0o755)  # as /opt, /var/lib and /usr/local are, whatever the umask
    stat_paths = " ".join(EXPECTED_LAYOUT)
    # A Python only root can reach (this venv's, under /root) must be refused with a reason.
    private = private_python()
    private_python_check = (
        f"if bash {top}/install.sh --device-id cam-07 --python {private} 2> {tmp_path}/private.err; "
        "then echo 'private python accepted' >&2; exit 1; fi"
        if private
        else ""
    )
    script = tmp_path / "device.sh"
    script.write_text(
        f"""set -e
mount --bind {scratch}/etc /etc
mount --bind {scratch}/opt /opt
mount --bind {scratch}/varlib /var/lib
mount --bind {scratch}/usrlocal /usr/local
mount -t tmpfs none /run
bash {top}/install.sh --device-id cam-07 --python {python}
/usr/local/bin/edge-agent key > {tmp_path}/key.pem
stat -c '%n %a %U:%G' {stat_paths} > {tmp_path}/layout.txt
id -nG edgesdk > {tmp_path}/groups.txt
getent passwd edgesdk > {tmp_path}/passwd.txt
{private_python_check}
"""
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--fork", "bash", str(script)],
        capture_output=True,
        text=True,
        env=offline_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "creating user edgesdk" in proc.stdout
    layout = dict(line.split(" ", 1) for line in (tmp_path / "layout.txt").read_text().splitlines())
    assert layout == EXPECTED_LAYOUT
    passwd = (tmp_path / "passwd.txt").read_text().strip().split(":")
    assert passwd[5] == "/var/lib/edgesdk" and passwd[6] == "/usr/sbin/nologin"
    assert "BEGIN PUBLIC KEY" in (tmp_path / "key.pem").read_text()
    if private:
        assert "user edgesdk cannot run" in (tmp_path / "private.err").read_text()
    # The host was not touched.
    assert subprocess.run(["getent", "passwd", "edgesdk"], capture_output=True).returncode != 0
    assert not Path("/etc/edgesdk").exists()
