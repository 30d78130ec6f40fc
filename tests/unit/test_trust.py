"""Trust documents: signing, thresholds, rotation, rollback, expiry, role separation, the
agent's copy (AgentTrust, KeyFiles) and the CLI. Real Ed25519 keys throughout."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgesdk.errors import SchemaError, SignatureError, TrustError, TrustExpiredError, TrustRollbackError
from edgesdk.keys import generate_publisher_key
from edgesdk.protocol import topics
from edgesdk.trust import canonical_bytes, document_bytes, parse_document, verify_self, verify_update
from tests.trust_helpers import make_root, trust_document, write_document


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    return {
        "root": make_root(tmp_path / "root"),
        "root2": make_root(tmp_path / "root2"),
        "root3": make_root(tmp_path / "root3"),
        "publisher": generate_publisher_key(tmp_path / "publisher"),
        "publisher2": generate_publisher_key(tmp_path / "publisher2"),
        "operator": generate_publisher_key(tmp_path / "operator"),
    }


def doc(keys, *, version=1, roots=("root",), signers=("root",), publishers=("publisher",), threshold=1, **kw):
    return trust_document(
        version=version,
        root_pubs=[keys[r][1] for r in roots],
        publisher_pubs=[keys[p][1] for p in publishers],
        operator_pubs=[keys["operator"][1]],
        signers=[keys[s][0] for s in signers],
        root_threshold=threshold,
        **kw,
    )


def test_a_signed_document_verifies_and_a_tampered_one_does_not(keys) -> None:
    document = doc(keys)
    verify_self(document)
    assert parse_document(document_bytes(document), source="t") == document  # the file form round-trips
    tampered = document.model_copy(update={"version": 7})
    with pytest.raises(TrustError, match="signed by 0 of its own root keys; it needs 1"):
        verify_self(tampered)
    unsigned = document.model_copy(update={"signatures": []})
    with pytest.raises(TrustError):
        verify_self(unsigned)


def test_the_canonical_bytes_leave_out_the_signatures_only(keys) -> None:
    document = doc(keys)
    assert canonical_bytes(document) == canonical_bytes(document.model_copy(update={"signatures": []}))
    assert b'"version":1' in canonical_bytes(document)


def test_a_threshold_counts_distinct_keys_with_valid_signatures(keys) -> None:
    one = doc(keys, roots=("root", "root2", "root3"), signers=("root",), threshold=2)
    with pytest.raises(TrustError, match="signed by 1 of .* it needs 2"):
        verify_self(one)
    # The same key's signature twice still counts once.
    doubled = one.model_copy(update={"signatures": one.signatures * 2})
    with pytest.raises(TrustError, match="signed by 1 of"):
        verify_self(doubled)
    verify_self(doc(keys, roots=("root", "root2", "root3"), signers=("root", "root3"), threshold=2))


def test_a_signature_by_a_key_outside_the_root_role_counts_for_nothing(keys) -> None:
    # Signed by the publisher key (a valid Ed25519 signature, but not by a root key).
    document = doc(keys, signers=("publisher",))
    with pytest.raises(TrustError, match="signed by 0"):
        verify_self(document)


def test_rotation_needs_the_old_root_and_the_new_root(keys) -> None:
    current = doc(keys, version=1)
    only_new = doc(keys, version=2, roots=("root2",), signers=("root2",))
    with pytest.raises(TrustError, match=r"0 of the trusted \(version 1\) root keys"):
        verify_update(current, only_new)
    only_old = doc(keys, version=2, roots=("root2",), signers=("root",))
    with pytest.raises(TrustError, match="0 of its own root keys"):
        verify_update(current, only_old)
    both = doc(keys, version=2, roots=("root2",), signers=("root", "root2"))
    verify_update(current, both)
    # From then on the old root has no say: version 3 signed by it alone is refused.
    with pytest.raises(TrustError, match=r"trusted \(version 2\)"):
        verify_update(both, doc(keys, version=3, signers=("root",)))


def test_an_older_or_equal_version_is_a_rollback(keys) -> None:
    v2 = doc(keys, version=2)
    for version in (1, 2):
        with pytest.raises(TrustRollbackError, match=f"version {version} is not newer than the trusted version 2"):
            verify_update(v2, doc(keys, version=version, publishers=("publisher2",)))


def test_an_expired_document_is_refused_as_an_update_and_refuses_new_content(keys) -> None:
    from edgesdk.trust import require_current

    past = datetime.now(timezone.utc) - timedelta(hours=1)
    expired = doc(keys, version=2, expires_at=past)
    verify_self(expired)  # the signatures still hold: expiry is a separate question
    with pytest.raises(TrustExpiredError, match="version 2 expired at"):
        verify_update(doc(keys, version=1), expired)
    with pytest.raises(TrustExpiredError):
        require_current(expired)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["roles"]["operator"].update(d["roles"]["publisher"]), "in both the publisher and the operator"),
        (lambda d: d["roles"]["publisher"].update(threshold=2), "publisher threshold 2"),
        (lambda d: d["roles"]["root"].update(threshold=3), "threshold 3 is more than the role's 1"),
        (
            lambda d: d["roles"]["root"].update(keys={"0" * 32: next(iter(d["roles"]["root"]["keys"].values()))}),
            "not the SHA-256",
        ),
        (lambda d: d.update(expires_at="2030-01-01T00:00:00"), "timezone"),
        (lambda d: d.update(extra=1), "extra"),
    ],
    ids=[
        "key-in-two-roles",
        "publisher-threshold",
        "threshold-too-high",
        "id-mismatch",
        "naive-expiry",
        "unknown-field",
    ],
)
def test_the_schema_refuses_documents_that_undo_the_roles(keys, mutate, needle) -> None:
    data = json.loads(document_bytes(doc(keys, publishers=("publisher", "publisher2"))))
    mutate(data)
    with pytest.raises(TrustError, match=needle):
        parse_document(json.dumps(data).encode(), source="t")


def test_the_agent_keeps_a_newer_document_and_refuses_going_back(keys, tmp_path) -> None:
    from edgesdk.agent.events import EventBus
    from edgesdk.agent.trust import AgentTrust

    shipped = write_document(doc(keys, version=1), tmp_path / "shipped.json")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    events = EventBus()
    seen: list[tuple[str, dict]] = []
    events.subscribe(lambda name, detail: seen.append((name, detail)))
    trust = AgentTrust(shipped, data_dir, events=events)
    assert trust.path == shipped
    v2 = doc(keys, version=2, publishers=("publisher2",))
    trust.on_message(document_bytes(v2))
    assert seen[-1][0] == "trust_updated" and seen[-1][1]["version"] == 2
    assert trust.path == data_dir / "trust.json"
    trust.on_message(document_bytes(v2))  # the retained message again at reconnect: nothing happens
    assert len(seen) == 1
    trust.on_message(document_bytes(doc(keys, version=1)))
    assert seen[-1][0] == "trust_refused" and "not newer" in seen[-1][1]["reason"]
    # A restart reads the installed document, never the shipped one again.
    again = AgentTrust(shipped, data_dir)
    assert again.verified().version == 2
    with pytest.raises(TrustRollbackError):
        again.install(document_bytes(doc(keys, version=1)), source="sideload")
    assert again.status()["publisher_keys"] == sorted(v2.roles.publisher.keys)


def test_keyfiles_give_each_role_its_own_keys(keys, tmp_path) -> None:
    from edgesdk.agent.keyring import KeyFiles
    from edgesdk.agent.trust import AgentTrust

    from edgesdk.keys import key_id, load_publisher_private_key
    from edgesdk.protocol.signing import sign_deployment, verify_deployment
    from edgesdk.schemas.messages import Deployment

    shipped = write_document(doc(keys), tmp_path / "trust.json")
    ring = KeyFiles(tmp_path / "device.key", [keys["operator"][1]], trust=AgentTrust(shipped, tmp_path))
    publisher_id = key_id(load_publisher_private_key(keys["publisher"][0]).public_key())
    operator_id = key_id(load_publisher_private_key(keys["operator"][0]).public_key())
    assert [key_id(k) for k in ring.trusted_publishers] == [publisher_id]  # the configured list is not used
    assert [key_id(k) for k in ring.trusted_operators] == [operator_id]
    deployment = Deployment(
        deployment_id="d1",
        issued_at=datetime.now(timezone.utc),
        model_name="m",
        model_version="1.0.0",
        release=1,
        bundle_sha256="0" * 64,
        bundle_size=1,
        expires_at=datetime.now(timezone.utc) + timedelta(hours=1),
        sequence=1,
        targets=["dev-1"],
    )
    by_publisher = sign_deployment(deployment, load_publisher_private_key(keys["publisher"][0]))
    with pytest.raises(SignatureError, match="unknown key"):
        verify_deployment(by_publisher, ring.trusted_operators)
    assert (
        verify_deployment(
            sign_deployment(deployment, load_publisher_private_key(keys["operator"][0])), ring.trusted_operators
        )
        == operator_id
    )


def test_an_expired_document_keeps_the_publishers_but_gives_no_operators(keys, tmp_path) -> None:
    from edgesdk.agent.keyring import KeyFiles
    from edgesdk.agent.trust import AgentTrust

    past = datetime.now(timezone.utc) - timedelta(minutes=1)
    shipped = write_document(doc(keys, expires_at=past), tmp_path / "trust.json")
    trust = AgentTrust(shipped, tmp_path)
    ring = KeyFiles(tmp_path / "device.key", [], trust=trust)
    assert len(ring.trusted_publishers) == 1  # installed bundles go on verifying and serving
    with pytest.raises(TrustExpiredError):
        _ = ring.trusted_operators
    assert "expired" in (trust.report_expiry() or "") and trust.status()["expired"] is True


def test_without_a_trust_document_one_key_list_serves_both_roles(keys, tmp_path) -> None:
    from edgesdk.agent.keyring import KeyFiles

    ring = KeyFiles(tmp_path / "device.key", [keys["publisher"][1]])
    assert ring.trusted_operators == ring.trusted_publishers and len(ring.trusted_publishers) == 1


def test_the_fleet_trust_topic_parses_as_its_own_scope() -> None:
    topic = topics.fleet_topic("edgesdk", topics.TRUST)
    assert topic == "edgesdk/fleet/trust"
    parsed = topics.parse_topic("edgesdk", topic)
    assert parsed is not None and parsed.scope == "fleet" and parsed.suffix == "trust"
    assert topics.parse_topic("edgesdk", "edgesdk/devices/dev-1/ota/deployment").scope == "devices"


# -- the CLI ----------------------------------------------------------------------------------------


def run(*argv: str) -> tuple[int, str, str]:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "edgesdk.cli.main", *argv], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


def test_cli_signs_rotates_and_shows(tmp_path) -> None:
    assert run("keys", "root", "--out", str(tmp_path / "root"))[0] == 0
    assert run("keys", "root", "--out", str(tmp_path / "root2"))[0] == 0
    for name in ("pub", "ops"):
        assert run("keys", "publisher", "--out", str(tmp_path / name))[0] == 0
    common = [
        "--publisher-key",
        str(tmp_path / "pub/publisher.pub"),
        "--operator-key",
        str(tmp_path / "ops/publisher.pub"),
    ]
    v1 = tmp_path / "v1.json"
    code, _, err = run(
        "trust",
        "sign",
        "--root-key",
        str(tmp_path / "root/root.key"),
        *common,
        "--version",
        "1",
        "--expires",
        "30d",
        "-o",
        str(v1),
    )
    assert code == 0, err
    # A rotation signed by the new root only: one clear line, non-zero, nothing written.
    v2 = tmp_path / "v2.json"
    code, out, err = run(
        "trust", "sign", "--previous", str(v1), "--root-key", str(tmp_path / "root2/root.key"), *common, "-o", str(v2)
    )
    assert code == 1 and err.startswith("error: trust document version 2 is signed by 0 of the trusted (version 1)")
    assert len(err.strip().splitlines()) == 1 and not v2.exists()
    code, _, err = run(
        "trust", "sign", "--previous", str(v1),
        "--root-key", str(tmp_path / "root/root.key"), "--root-key", str(tmp_path / "root2/root.key"),
        "--root-pub", str(tmp_path / "root2/root.pub"), *common, "-o", str(v2),
    )  # fmt: skip
    assert code == 0, err
    code, out, _ = run("trust", "show", str(v2), "--json")
    shown = json.loads(out)
    assert shown["version"] == 2 and shown["self_signed_ok"] and len(shown["signatures"]) == 2
    code, _, err = run(
        "trust",
        "sign",
        "--previous",
        str(v2),
        "--version",
        "2",
        "--root-key",
        str(tmp_path / "root2/root.key"),
        *common,
        "-o",
        str(tmp_path / "v3.json"),
    )
    assert code == 1 and "not newer" in err and len(err.strip().splitlines()) == 1
    code, _, err = run("trust", "show", str(tmp_path / "missing.json"))
    assert code == 1 and err.startswith("error: trust document") and len(err.strip().splitlines()) == 1


def test_a_schema_error_in_the_file_is_a_trust_error(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(TrustError, match="not valid JSON"):
        parse_document(bad.read_bytes(), source="bad")
    assert issubclass(TrustError, Exception) and not issubclass(TrustError, SchemaError)
