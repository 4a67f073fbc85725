"""SHA-256 manifests of a model's files and Ed25519 signatures over them.

A manifest lists every file (relative path -> sha256, size) plus the caller's metadata (model name,
version, run id), serialised canonically (sorted keys, no spaces, UTF-8) so the same content always gives
the same bytes, hence the same digest and, Ed25519 being deterministic, the same signature.

Keys are PEM files: ``signing_key.pem`` (PKCS#8, private, mode 0600) signs, ``verify_key.pem``
(SubjectPublicKeyInfo) is its public half. Where they are, unless a caller passes one:
``TRAINYARD_SIGNING_KEY`` / ``TRAINYARD_VERIFY_KEY`` (a path, or the PEM text itself), else
``$TRAINYARD_HOME/keys/`` (mode 0700: the Airflow user's alone; a sandboxed training cannot reach it).

Rotation: one key signs, several verify. Every signing key's public half stays in ``keys/trusted/`` as
``<key id>.pem`` (the id: :func:`key_id`) after :func:`rotate` replaces the signing key, so the versions it
signed keep verifying; :func:`distrust` removes one (a leaked key), and the versions it signed then fail.
Verification picks the key by the id the version was signed with and refuses an id it does not trust
(:func:`trusted_keys`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard import paths
from trainyard.errors import PermanentError
from trainyard.files import atomic_write, file_lock

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

FORMAT = "trainyard-manifest/1"
# a signed version's tags: the manifest's digest, its signature and the id of the key that made it
DIGEST_TAG = "trainyard.manifest_sha256"
SIGNATURE_TAG = "trainyard.signature"
KEY_ID_TAG = "trainyard.signing_key_id"
PRIVATE_NAME = "signing_key.pem"
PUBLIC_NAME = "verify_key.pem"
SIGNING_ENV = "TRAINYARD_SIGNING_KEY"
VERIFY_ENV = "TRAINYARD_VERIFY_KEY"

KeySource = str | bytes | Path | None


class SigningKeyError(PermanentError):
    """No usable key where one was looked for; the message says where and how to make one."""


class VerificationError(PermanentError):
    """The files do not match the signed manifest. ``problems`` lists each finding; the message all of them."""

    def __init__(self, subject: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"{subject} failed verification:\n  - " + "\n  - ".join(problems))


TRUSTED_DIR = "trusted"

Keyring = dict[str, "Ed25519PublicKey"]  # key id -> verify key


# -- keys ----------------------------------------------------------------------------------------------
def keys_dir() -> Path:
    return paths.home() / "keys"


def _trust(directory: Path, public_pem: bytes) -> str:
    """Add a public key to ``directory``'s trusted keys (idempotent); its key id."""
    kid = key_id(load_public_key(public_pem))
    trusted = directory / TRUSTED_DIR
    trusted.mkdir(mode=0o700, exist_ok=True)
    target = trusted / f"{kid}.pem"
    if not target.exists():
        atomic_write(target, public_pem)
    return kid


def _write_private(path: Path, pem: bytes, *, replace: bool) -> None:
    """0600 from the first byte on. ``replace``: atomically over the old key (rotation), else O_EXCL (a
    concurrent keygen cannot silently replace this key)."""
    if replace:
        atomic_write(path, pem)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())


def _keys_lock(directory: Path):
    """One key change at a time in ``directory`` (keygen, rotate, distrust from several processes)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return file_lock(directory / ".lock")


def _new_pems() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return private, _public_pem(key.public_key())


def generate_keypair(directory: str | Path | None = None) -> tuple[Path, Path]:
    """A new Ed25519 key pair in ``directory`` (default ``$TRAINYARD_HOME/keys``), its public half trusted;
    never overwrites one (:func:`rotate` replaces the signing key)."""
    d = Path(directory) if directory else keys_dir()
    private, public = d / PRIVATE_NAME, d / PUBLIC_NAME
    with _keys_lock(d):
        existing = [str(p) for p in (private, public) if p.exists()]
        if existing:
            raise FileExistsError(f"refusing to overwrite existing key file(s): {', '.join(existing)}")
        private_pem, public_pem = _new_pems()
        _write_private(private, private_pem, replace=False)
        public.write_bytes(public_pem)
        _trust(d, public_pem)
    return private, public


def ensure_keypair(directory: str | Path | None = None) -> tuple[Path, Path]:
    """The key pair in ``directory``, created if neither file is there (set-up scripts, test fixtures); a
    pair made before key rotation existed gets its public half trusted."""
    d = Path(directory) if directory else keys_dir()
    private, public = d / PRIVATE_NAME, d / PUBLIC_NAME
    if private.is_file() and public.is_file():
        if not (d / TRUSTED_DIR / f"{key_id(load_public_key(public))}.pem").exists():
            with _keys_lock(d):
                _trust(d, public.read_bytes())
        return private, public
    return generate_keypair(d)


def rotate(directory: str | Path | None = None) -> tuple[str, str]:
    """A new signing key replaces the current one, whose public half stays trusted so that what it signed
    keeps verifying; the old private key is gone. Returns (old key id, new key id)."""
    d = Path(directory) if directory else keys_dir()
    with _keys_lock(d):
        private = d / PRIVATE_NAME
        if not private.is_file():
            raise SigningKeyError(f"no signing key at {private} to rotate; create one with `trainyard models keygen`")
        old = load_private_key(private).public_key()
        _trust(d, _public_pem(old))
        private_pem, public_pem = _new_pems()
        new = _trust(d, public_pem)  # trusted before it signs anything: a crash leaves no untrusted signer
        _write_private(private, private_pem, replace=True)
        atomic_write(d / PUBLIC_NAME, public_pem)
        return key_id(old), new


def distrust(kid: str, directory: str | Path | None = None) -> Path:
    """Stop trusting key ``kid`` (a leaked or retired key): what it signed fails verification from now on.
    The current signing key cannot be distrusted; rotate first."""
    d = Path(directory) if directory else keys_dir()
    if not re.fullmatch(r"[0-9a-f]{16}", kid):
        raise SigningKeyError(f"{kid!r} is not a key id (16 hex digits, as `trainyard models keys list` prints)")
    with _keys_lock(d):
        target = d / TRUSTED_DIR / f"{kid}.pem"
        if not target.is_file():
            raise SigningKeyError(f"key {kid} is not trusted here; trusted: {', '.join(trusted_keys(d)) or 'none'}")
        if (d / PRIVATE_NAME).is_file() and key_id(load_private_key(d / PRIVATE_NAME)) == kid:
            raise SigningKeyError(
                f"key {kid} is the current signing key; `trainyard models keys rotate` first, then distrust it"
            )
        target.unlink()
        return target


def trusted_keys(source: KeySource = None) -> Keyring:
    """The verify keys by key id: the one of ``source`` or ``$TRAINYARD_VERIFY_KEY`` when given (a path or
    PEM: that key alone, or a directory: its trusted keys); else every key in ``keys/trusted/`` (a key
    directory made before rotation existed, without ``trusted/``: its ``verify_key.pem``)."""
    if source is None and os.environ.get(VERIFY_ENV):
        source = os.environ[VERIFY_ENV]
    directory = Path(source).expanduser() if isinstance(source, (str, Path)) and _is_dir(source) else None
    if source is not None and directory is None:
        key = load_public_key(source)
        return {key_id(key): key}
    d = directory or keys_dir()
    ring: Keyring = {}
    for pem in sorted((d / TRUSTED_DIR).glob("*.pem")):
        key = load_public_key(pem)
        ring[key_id(key)] = key
    if not (d / TRUSTED_DIR).is_dir() and (d / PUBLIC_NAME).is_file():
        key = load_public_key(d / PUBLIC_NAME)
        ring[key_id(key)] = key
    if not ring:
        raise SigningKeyError(
            f"no trusted verify key in {d}; create a key pair with `trainyard models keygen` "
            f"or point ${VERIFY_ENV} at a PEM file"
        )
    return ring


def _is_dir(source: str | Path) -> bool:
    return not str(source).lstrip().startswith("-----BEGIN") and Path(source).expanduser().is_dir()


def _public_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _pem(source: KeySource, env: str, default_name: str, what: str) -> tuple[bytes, str]:
    """The PEM bytes of ``source`` (PEM text or a path), or of the env var's value, or of the default file."""
    origin = "argument"
    if source is None and os.environ.get(env):
        source, origin = os.environ[env], f"${env}"
    if source is None:
        source, origin = keys_dir() / default_name, "default location"
    if isinstance(source, bytes):
        return source, origin
    if isinstance(source, str) and source.lstrip().startswith("-----BEGIN"):
        return source.encode(), origin
    path = Path(source).expanduser()
    if not path.is_file():
        raise SigningKeyError(
            f"no {what} at {path} ({origin}); create a key pair with `trainyard models keygen` "
            f"or point ${env} at a PEM file"
        )
    return path.read_bytes(), str(path)


def load_private_key(path_or_pem: KeySource = None):
    """The Ed25519 signing key from a path, PEM text/bytes, ``$TRAINYARD_SIGNING_KEY`` or the default file."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    pem, origin = _pem(path_or_pem, SIGNING_ENV, PRIVATE_NAME, "signing key")
    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as err:
        raise SigningKeyError(f"signing key from {origin} is not an unencrypted PEM private key: {err}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"signing key from {origin} is {type(key).__name__}, not Ed25519")
    return key


def load_public_key(path_or_pem: KeySource | Ed25519PublicKey | Ed25519PrivateKey = None):
    """The Ed25519 verify key (from a public PEM, or derived from a private one)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    if isinstance(path_or_pem, (Ed25519PublicKey, Ed25519PrivateKey)):
        return path_or_pem.public_key() if isinstance(path_or_pem, Ed25519PrivateKey) else path_or_pem
    pem, origin = _pem(path_or_pem, VERIFY_ENV, PUBLIC_NAME, "verify key")
    if b"PRIVATE KEY" in pem:
        return load_private_key(pem).public_key()
    try:
        key = load_pem_public_key(pem)
    except (ValueError, TypeError) as err:
        raise SigningKeyError(f"verify key from {origin} is not a PEM public key: {err}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"verify key from {origin} is {type(key).__name__}, not Ed25519")
    return key


def key_id(key) -> str:
    """A short fingerprint of a (public or private) key: the first 16 hex digits of sha256(raw public key)."""
    from cryptography.hazmat.primitives import serialization

    pub = key.public_key() if hasattr(key, "public_key") else key
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


# -- manifests -------------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def files_under(root: str | Path) -> dict[str, Path]:
    """Every regular file below ``root``, keyed by its POSIX path relative to ``root``."""
    root = Path(root)
    if root.is_file():
        return {root.name: root}
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def manifest(files: Mapping[str, Path], /, **metadata) -> dict:
    """The manifest of ``files`` (relative path -> local path) with ``metadata`` (e.g. model, version, run_id)."""
    clash = {"format", "files"} & set(metadata)
    if clash:
        raise ValueError(f"metadata may not set {sorted(clash)}")
    return {
        "format": FORMAT,
        "files": {
            rel: {"sha256": sha256_file(Path(p)), "size": Path(p).stat().st_size} for rel, p in sorted(files.items())
        },
        **{k: (None if v is None else str(v)) for k, v in metadata.items()},
    }


def canonical(m: dict) -> bytes:
    return json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def digest(m: dict) -> str:
    return hashlib.sha256(canonical(m)).hexdigest()


def sign(m: dict, private_key) -> str:
    """The base64 Ed25519 signature over the canonical manifest bytes."""
    return base64.b64encode(private_key.sign(canonical(m))).decode("ascii")


def signature_valid(m: dict, signature: str, public_key) -> bool:
    """Whether ``signature`` is ``public_key``'s over the canonical manifest ``m`` (no file is read)."""
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(base64.b64decode(signature, validate=True), canonical(m))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def verify(m: dict, signature: str, public_key, files: Mapping[str, Path], subject: str = "artifact set") -> None:
    """Check the signature over ``m`` and re-hash every file of ``files`` against it.

    Raises VerificationError listing every problem: a bad signature, a changed, missing or extra file."""
    problems = []
    if m.get("format") != FORMAT:
        problems.append(f"manifest format {m.get('format')!r} is not {FORMAT!r}")
    if not signature_valid(m, signature, public_key):
        problems.append(
            f"signature does not match the manifest for verify key {key_id(public_key)} "
            "(wrong key, or the manifest or signature was altered)"
        )
    listed = m.get("files") or {}
    for rel in sorted(set(listed) | set(files)):
        if rel not in files:
            problems.append(f"{rel}: missing (listed in the manifest)")
        elif rel not in listed:
            problems.append(f"{rel}: extra file (not in the manifest)")
        else:
            want, path = listed[rel], Path(files[rel])
            size = path.stat().st_size
            got = sha256_file(path)
            if got != want["sha256"] or size != want["size"]:
                problems.append(
                    f"{rel}: content changed (sha256 {got[:12]}, {size} bytes; "
                    f"signed {want['sha256'][:12]}, {want['size']} bytes)"
                )
    if problems:
        raise VerificationError(subject, problems)
