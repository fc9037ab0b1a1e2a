"""One key per learner, derived from the run's secret: who may speak as learner N.

With one shared secret every learner could HELLO as any other, supersede its incarnation,
reuse its nonce or move its data position. So the syncer alone holds the run secret, and
learner N gets only key_N = HKDF-SHA256(run secret, salt, "islands/3 learner N") (RFC
5869, as TLS 1.3 derives its traffic keys): a one-way function, so key_2 says nothing
about key_1 or the secret, and the syncer can derive every key on demand without storing
any. The wire handshake (wire.py) names N in the opening and keys the connection with
key_N, so a HELLO as N verifies only under key_N.

A key file says what it is, on one line: `islands-learner-key v1 learner=N <64 hex>`, so a
learner handed the run secret where a key is expected (or another learner's key) is told
so instead of failing every handshake with bad_mac. Stdlib only (hmac, hashlib): the
`cryptography` package is not a dependency, and HKDF is two HMAC loops.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path

from .secretfile import SECRET_MODE, _write_private

HASH_LEN = hashlib.sha256().digest_size
KEY_BYTES = 32
_SALT = b"islands/3 learner keys"
KEY_FILE_MAGIC = "islands-learner-key"
KEY_FILE_VERSION = "v1"
_KEY_LINE = re.compile(rf"^{KEY_FILE_MAGIC} (\S+) learner=(\d+) ([0-9a-f]{{{2 * KEY_BYTES}}})$")
KEY_FILE_ENV = "ISLANDS_KEY_FILE"


def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    """RFC 5869 §2.2: PRK = HMAC-Hash(salt, IKM); an empty salt is HashLen zeros."""
    return hmac.new(salt or b"\0" * HASH_LEN, ikm, hashlib.sha256).digest()


def hkdf_expand(prk: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 §2.3: T(i) = HMAC-Hash(PRK, T(i-1) | info | i), concatenated to `length`."""
    if not 0 < length <= 255 * HASH_LEN:
        raise ValueError(f"HKDF-SHA256 output length must be in 1..{255 * HASH_LEN}, got {length}")
    out, block = b"", b""
    for i in range(1, -(-length // HASH_LEN) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:length]


def hkdf(ikm: bytes, salt: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869): extract, then expand."""
    return hkdf_expand(hkdf_extract(salt, ikm), info, length)


def learner_key(secret: bytes, learner: int) -> bytes:
    """key_N: what learner N holds instead of the run secret (the syncer derives it again)."""
    if not isinstance(learner, int) or learner < 0:
        raise ValueError(f"a learner id is a non-negative integer, got {learner!r}")
    return hkdf(secret, _SALT, f"islands/3 learner {learner}".encode())


def key_file_text(secret: bytes, learner: int) -> str:
    """The one line of learner N's key file."""
    return f"{KEY_FILE_MAGIC} {KEY_FILE_VERSION} learner={learner} {learner_key(secret, learner).hex()}\n"


def is_key_file_text(text: bytes) -> bool:
    """Whether `text` is a learner key file's (not a run secret)."""
    return text.lstrip().startswith(KEY_FILE_MAGIC.encode())


def parse_key_file(text: bytes, origin: str) -> tuple[int, bytes]:
    """(learner, key) from a key file's bytes; ValueError naming `origin` otherwise."""
    if not is_key_file_text(text):
        raise ValueError(f"{origin} is not a learner key file (it does not start with {KEY_FILE_MAGIC!r}): "
                         "a run secret goes to the syncer's --secret-file; a learner's key file is written "
                         "with `python -m trainer.keys SECRET_FILE LEARNER OUT`")
    match = _KEY_LINE.match(text.decode("ascii", "replace").strip())
    if match is None or match.group(1) != KEY_FILE_VERSION:
        raise ValueError(f"{origin}: malformed learner key file (expected one line "
                         f"'{KEY_FILE_MAGIC} {KEY_FILE_VERSION} learner=N <{2 * KEY_BYTES} hex digits>')")
    return int(match.group(2)), bytes.fromhex(match.group(3))


def load_key_file(path: str | os.PathLike, learner: int, origin: str = "--key-file") -> bytes:
    """Learner `learner`'s key from its key file; refuses another learner's key by name."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{origin}: cannot read {path}: {exc.strerror}") from exc
    owner, key = parse_key_file(text, f"{origin} {path}")
    if owner != learner:
        raise ValueError(f"{origin} {path} is learner {owner}'s key; this is learner {learner} "
                         f"(each learner holds only its own key)")
    return key


def load_learner_key(learner: int, key_file: str | None = None, secret_file: str | None = None) -> bytes:
    """Learner N's key, from (first found) --key-file, --secret-file, $ISLANDS_KEY_FILE, or
    the run secret of $ISLANDS_SECRET_FILE / $ISLANDS_SECRET. From a run secret the learner
    derives key_N itself: the old way, which trusts that process with every identity (it
    could derive any key), so launchers hand each learner its key file instead."""
    from .wire import load_secret
    if key_file and secret_file:
        raise ValueError("--key-file and --secret-file: give a learner one of them (its own key file, or the "
                         "run secret it derives its key from)")
    if key_file:
        return load_key_file(key_file, learner, "--key-file")
    if secret_file is None and os.environ.get(KEY_FILE_ENV):
        return load_key_file(os.environ[KEY_FILE_ENV], learner, f"${KEY_FILE_ENV}")
    return learner_key(load_secret(secret_file), learner)


def write_key_file(path: str | os.PathLike, secret: bytes, learner: int) -> Path:
    """Learner N's key file at `path`, 0600 from its first byte, replaced atomically (the
    run's secret may have changed since an earlier run wrote it)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    _write_private(tmp, key_file_text(secret, learner).encode())
    os.replace(tmp, target)
    return target


def write_key_files(directory: str | os.PathLike, secret: bytes, learners: int) -> dict[int, Path]:
    """keys/learner-N.key for N in 1..learners: what a launcher hands each learner."""
    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.chmod(0o700)
    return {n: write_key_file(root / f"learner-{n}.key", secret, n) for n in range(1, learners + 1)}


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.keys SECRET_FILE LEARNER OUT`: write learner N's key file (0600)."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or not args[1].isdigit():
        print("usage: python -m trainer.keys SECRET_FILE LEARNER OUT   (writes learner LEARNER's key file)",
              file=sys.stderr)
        return 2
    from .wire import load_secret
    try:
        secret = load_secret(args[0])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(write_key_file(args[2], secret, int(args[1])))
    return 0


__all__ = ["KEY_FILE_ENV", "SECRET_MODE", "hkdf", "hkdf_expand", "hkdf_extract", "is_key_file_text",
           "learner_key", "load_key_file", "load_learner_key", "parse_key_file", "write_key_file", "write_key_files"]

if __name__ == "__main__":
    raise SystemExit(main())
