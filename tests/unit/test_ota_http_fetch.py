"""The HTTP artifact download's rules without processes: missing runs, redirects, signatures
over the URL list, the rollout options' checks. (Real servers: tests/integration/test_ota_http.py.)"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from edgesdk.agent.ota.http_fetch import HttpSettings, _check_redirect, missing_runs

from edgesdk.cli.main import cli, run_cli
from edgesdk.errors import UpdateError
from edgesdk.protocol.signing import canonical_json, sign_deployment, verify_deployment
from edgesdk.schemas.messages import Deployment
from tests.ota_helpers import command_fields


def _deployment(**extra: object) -> Deployment:
    return Deployment(
        deployment_id="dep-http",
        model_name="digits",
        model_version="1.1.0",
        release=2,
        bundle_sha256="a" * 64,
        bundle_size=1000,
        **command_fields(),
        **extra,  # type: ignore[arg-type]
    )


def test_missing_runs_group_consecutive_chunks() -> None:
    assert missing_runs(set(), 4) == [(0, 3)]
    assert missing_runs({0, 1, 2, 3}, 4) == []
    assert missing_runs({1, 2, 5}, 7) == [(0, 0), (3, 4), (6, 6)]


def test_redirects_stay_on_their_origin_unless_the_host_is_allowed() -> None:
    plain = HttpSettings()
    _check_redirect("http://a.example/x", "http://a.example/y", plain)
    _check_redirect("https://a.example/x", "https://a.example:443/y", plain)
    with pytest.raises(UpdateError, match=r"another host \(b.example:80\)"):
        _check_redirect("http://a.example/x", "http://b.example/x", plain)
    with pytest.raises(UpdateError, match="another host"):
        _check_redirect("http://a.example/x", "http://a.example:8080/x", plain)
    with pytest.raises(UpdateError, match="https to"):
        _check_redirect("https://a.example/x", "http://a.example/x", plain)
    cdn = HttpSettings(redirect_hosts=("edge.cdn.example",))
    _check_redirect("https://a.example/x", "https://edge.cdn.example/x", cdn)
    with pytest.raises(UpdateError, match="https to"):
        _check_redirect("https://a.example/x", "http://edge.cdn.example/x", cdn)


def test_the_signature_covers_the_url_list_and_older_commands_still_verify() -> None:
    key = Ed25519PrivateKey.generate()
    signed = sign_deployment(_deployment(artifact_urls=["https://cdn.example/b.edgepkg"]), key)
    verify_deployment(signed, [key.public_key()])
    for change in ({"artifact_urls": ["http://evil.example/b.edgepkg"]}, {"mqtt_fallback": False}):
        with pytest.raises(Exception, match="signature"):
            verify_deployment(signed.model_copy(update=change), [key.public_key()])
    # A command from before the fields existed: its signed bytes had neither key.
    plain = _deployment()
    assert b"artifact_urls" not in canonical_json(plain) and b"mqtt_fallback" not in canonical_json(plain)
    assert b"artifact_urls" in canonical_json(signed)


def test_artifact_sources_list_the_urls_then_a_legacy_url() -> None:
    both = _deployment(artifact_urls=["http://a/1", "http://b/2"], url="http://c/3")
    assert both.artifact_sources() == ["http://a/1", "http://b/2", "http://c/3"]
    assert _deployment().artifact_sources() == []


@pytest.mark.parametrize("command", ["push", "submit"])
def test_a_bad_artifact_url_is_one_error_line(tmp_path, capsys, command: str) -> None:
    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    extra = ["--broker", "mqtt://127.0.0.1:1", "--db", str(tmp_path / "f.db")] if command == "push" else []
    extra += [] if command == "push" else ["--data-dir", str(tmp_path)]
    code = run_cli(cli, ["fleet", command, str(bundle), "--devices", "d1", "--artifact-url", "ftp://x/b", *extra])
    err = capsys.readouterr().err
    assert code != 0
    assert err.strip() == "error: bad --artifact-url 'ftp://x/b': expected http(s)://HOST/PATH", err
