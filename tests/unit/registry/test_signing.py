import os
import stat

import pytest

from trainyard.registry import signing
from trainyard.registry.signing import SigningKeyError, VerificationError


@pytest.fixture
def keys(tmp_path):
    private, public = signing.generate_keypair(tmp_path / "keys")
    return signing.load_private_key(private), signing.load_public_key(public)


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "model.onnx").write_bytes(bytes(range(256)) * 8)
    (d / "MLmodel").write_text("flavors: {}\n")
    (d / "sub" / "labels.txt").write_text("0\n1\n")
    return d


def _signed(model_dir, private):
    m = signing.manifest(signing.files_under(model_dir), model="digits", version="3", run_id="abc")
    return m, signing.sign(m, private)


def test_round_trip(keys, model_dir):
    private, public = keys
    m, sig = _signed(model_dir, private)
    assert set(m["files"]) == {"model.onnx", "MLmodel", "sub/labels.txt"}
    assert m["files"]["model.onnx"]["size"] == 2048 and m["format"] == signing.FORMAT and m["version"] == "3"
    signing.verify(m, sig, public, signing.files_under(model_dir))


def test_flipped_byte_names_the_file(keys, model_dir):
    private, public = keys
    m, sig = _signed(model_dir, private)
    data = bytearray((model_dir / "model.onnx").read_bytes())
    data[100] ^= 0x01
    (model_dir / "model.onnx").write_bytes(bytes(data))  # same size, one bit different
    with pytest.raises(VerificationError) as err:
        signing.verify(m, sig, public, signing.files_under(model_dir), "digits v3")
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith("model.onnx: content changed")
    assert "digits v3 failed verification" in str(err.value)


def test_extra_and_missing_files_are_named(keys, model_dir):
    private, public = keys
    m, sig = _signed(model_dir, private)
    (model_dir / "sub" / "labels.txt").unlink()
    (model_dir / "backdoor.py").write_text("import os\n")
    with pytest.raises(VerificationError) as err:
        signing.verify(m, sig, public, signing.files_under(model_dir))
    assert sorted(err.value.problems) == [
        "backdoor.py: extra file (not in the manifest)",
        "sub/labels.txt: missing (listed in the manifest)",
    ]


def test_wrong_key_and_altered_manifest_fail(keys, model_dir, tmp_path):
    private, public = keys
    m, sig = _signed(model_dir, private)
    _, other_public = signing.generate_keypair(tmp_path / "other")
    with pytest.raises(VerificationError, match="signature does not match"):
        signing.verify(m, sig, signing.load_public_key(other_public), signing.files_under(model_dir))
    # Rewriting the manifest to match tampered files breaks the signature instead.
    (model_dir / "MLmodel").write_text("flavors: {evil: true}\n")
    forged = signing.manifest(signing.files_under(model_dir), model="digits", version="3", run_id="abc")
    with pytest.raises(VerificationError) as err:
        signing.verify(forged, sig, public, signing.files_under(model_dir))
    assert [p for p in err.value.problems if p.startswith("signature")] and len(err.value.problems) == 1


def test_manifest_is_canonical_and_signing_idempotent(keys, model_dir):
    private, _ = keys
    m1, sig1 = _signed(model_dir, private)
    m2 = signing.manifest(
        dict(reversed(list(signing.files_under(model_dir).items()))), run_id="abc", version="3", model="digits"
    )
    assert signing.canonical(m1) == signing.canonical(m2)
    assert b" " not in signing.canonical(m1)
    assert signing.digest(m1) == signing.digest(m2) and signing.sign(m2, private) == sig1
    with pytest.raises(ValueError):
        signing.manifest({}, files="x")


def test_keypair_files(tmp_path):
    private, public = signing.generate_keypair(tmp_path / "k")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    before = private.read_bytes()
    with pytest.raises(FileExistsError):
        signing.generate_keypair(tmp_path / "k")
    assert private.read_bytes() == before
    # The verify key can be derived from the signing key, and PEM text works like a path.
    priv = signing.load_private_key(private.read_text())
    assert signing.key_id(signing.load_public_key(private)) == signing.key_id(priv)
    assert signing.key_id(signing.load_public_key(public.read_bytes())) == signing.key_id(priv)


def test_default_key_locations(monkeypatch, tmp_path):
    home = tmp_path / "home"  # not the trainyard_home fixture: it may come with a key pair
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    monkeypatch.delenv(signing.SIGNING_ENV, raising=False)
    monkeypatch.delenv(signing.VERIFY_ENV, raising=False)
    with pytest.raises(SigningKeyError, match="trainyard models keygen"):
        signing.load_private_key()
    private, public = signing.generate_keypair()
    assert private == home.resolve() / "keys" / "signing_key.pem"
    assert signing.ensure_keypair() == (private, public)
    assert signing.key_id(signing.load_public_key()) == signing.key_id(signing.load_private_key())
    other_private, other_public = signing.generate_keypair(tmp_path / "env")
    monkeypatch.setenv(signing.VERIFY_ENV, str(other_public))
    monkeypatch.setenv(signing.SIGNING_ENV, other_private.read_text())
    assert signing.key_id(signing.load_public_key()) == signing.key_id(signing.load_private_key())
    assert signing.key_id(signing.load_public_key()) != signing.key_id(signing.load_public_key(public))


def test_non_ed25519_keys_are_refused(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(SigningKeyError, match="not Ed25519"):
        signing.load_private_key(pem)


def test_rotation_under_concurrent_processes(tmp_path):
    """Four processes rotate the same key directory at once: every rotation is kept (each old key stays
    trusted), one signing key is left, and it is the newest trusted one."""
    import subprocess
    import sys

    d = tmp_path / "k"
    first = signing.key_id(signing.load_public_key(signing.generate_keypair(d)[1]))
    code = "import sys; from trainyard.registry import signing; print(signing.rotate(sys.argv[1])[1])"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    new_ids = [p.communicate()[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    ring = signing.trusted_keys(d)
    assert set(ring) == {first, *new_ids} and len(ring) == 5
    signer = signing.key_id(signing.load_private_key(d / signing.PRIVATE_NAME))
    assert signer in new_ids and signing.key_id(signing.load_public_key(d / signing.PUBLIC_NAME)) == signer
    with pytest.raises(SigningKeyError, match="current signing key"):
        signing.distrust(signer, d)
    signing.distrust(first, d)
    assert first not in signing.trusted_keys(d)
    with pytest.raises(SigningKeyError, match="not trusted here"):
        signing.distrust(first, d)
