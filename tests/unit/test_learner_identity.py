"""Issue 27: one identity per learner. Each learner holds only its own key (HKDF of the
run secret and its id), so a learner cannot speak as another: (a) supersede its
incarnation, (b) reuse its nonce to push its seqs first, or (c) move its data position.
Through the syncer's real handshake, HELLO and push handling (syncer_rig)."""
from __future__ import annotations

import pytest

from tests.unit.syncer_rig import SECRET, TOKENS, Rig, poll_until, push_frame
from trainer import wire
from trainer.keys import (hkdf, hkdf_expand, hkdf_extract, key_file_text, learner_key, load_key_file,
                          load_learner_key, write_key_file, write_key_files)

# ----------------------------------------------------------------------------- HKDF: RFC 5869 appendix A


@pytest.mark.parametrize("ikm, salt, info, length, prk, okm", [
    # A.1 Test Case 1
    ("0b" * 22, "000102030405060708090a0b0c", "f0f1f2f3f4f5f6f7f8f9", 42,
     "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5",
     "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"),
    # A.2 Test Case 2: longer inputs and outputs
    ("".join(f"{i:02x}" for i in range(0x00, 0x50)), "".join(f"{i:02x}" for i in range(0x60, 0xb0)),
     "".join(f"{i:02x}" for i in range(0xb0, 0x100)), 82,
     "06a6b88c5853361a06104c9ceb35b45cef760014904671014a193f40c15fc244",
     "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c59045a99cac7827271cb41c65e590e09"
     "da3275600c2f09b8367793a9aca3db71cc30c58179ec3e87c14c01d5c1f3434f1d87"),
    # A.3 Test Case 3: zero-length salt and info
    ("0b" * 22, "", "", 42,
     "19ef24a32c717b167f33a91d6f648bdf96596776afdb6377ac434c1c293ccb04",
     "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"),
])
def test_hkdf_matches_rfc5869_vectors(ikm: str, salt: str, info: str, length: int, prk: str, okm: str) -> None:
    assert hkdf_extract(bytes.fromhex(salt), bytes.fromhex(ikm)).hex() == prk
    assert hkdf_expand(bytes.fromhex(prk), bytes.fromhex(info), length).hex() == okm
    assert hkdf(bytes.fromhex(ikm), bytes.fromhex(salt), bytes.fromhex(info), length).hex() == okm


def test_hkdf_refuses_an_impossible_length() -> None:
    with pytest.raises(ValueError, match="output length"):
        hkdf_expand(b"k" * 32, b"", 255 * 32 + 1)


def test_each_learner_has_its_own_key_and_it_is_not_the_secret() -> None:
    keys = {n: learner_key(SECRET, n) for n in range(1, 6)}
    assert len(set(keys.values())) == 5
    assert all(len(k) == 32 and SECRET not in k for k in keys.values())
    assert learner_key(SECRET, 3) == keys[3], "the syncer must derive the same key again"
    assert learner_key(b"another-run-secret-0123", 3) != keys[3]


# ----------------------------------------------------------------------------- key files and flags

def test_a_key_file_says_whose_key_it_is(tmp_path) -> None:
    path = write_key_file(tmp_path / "k", SECRET, 2)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text().startswith("islands-learner-key v1 learner=2 ")
    assert load_key_file(path, 2) == learner_key(SECRET, 2)
    assert SECRET.hex() not in path.read_text() and SECRET.decode() not in path.read_text()
    with pytest.raises(ValueError, match=r"--key-file .* is learner 2's key; this is learner 1"):
        load_key_file(path, 1)


def test_write_key_files_writes_one_private_file_per_learner(tmp_path) -> None:
    files = write_key_files(tmp_path / "keys", SECRET, 3)
    assert sorted(files) == [1, 2, 3]
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700
    for n, path in files.items():
        assert load_key_file(path, n) == learner_key(SECRET, n)


def test_learner_key_sources_and_their_errors(tmp_path, monkeypatch) -> None:
    for var in ("ISLANDS_KEY_FILE", "ISLANDS_SECRET_FILE", "ISLANDS_SECRET"):
        monkeypatch.delenv(var, raising=False)
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    key_file = write_key_file(tmp_path / "k1", SECRET, 1)
    assert load_learner_key(1, key_file=str(key_file)) == learner_key(SECRET, 1)
    assert load_learner_key(1, secret_file=str(secret_file)) == learner_key(SECRET, 1)  # the old way
    with pytest.raises(ValueError, match="--key-file and --secret-file"):
        load_learner_key(1, key_file=str(key_file), secret_file=str(secret_file))
    with pytest.raises(ValueError, match="--key-file .* is not a learner key file"):
        load_learner_key(1, key_file=str(secret_file))
    with pytest.raises(ValueError, match="--secret-file: .* is a learner's key file.*--key-file"):
        load_learner_key(1, secret_file=str(key_file))
    monkeypatch.setenv("ISLANDS_KEY_FILE", str(key_file))
    assert load_learner_key(1) == learner_key(SECRET, 1)
    with pytest.raises(ValueError, match=r"\$ISLANDS_KEY_FILE .* is learner 1's key"):
        load_learner_key(2)
    bad = tmp_path / "bad"
    bad.write_text("islands-learner-key v1 learner=1 zz\n")
    with pytest.raises(ValueError, match="malformed learner key file"):
        load_key_file(bad, 1)


def test_the_learner_cli_names_the_flag_in_its_error(tmp_path, capsys) -> None:
    from trainer.__main__ import main
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    with pytest.raises(SystemExit) as ei:
        main(["learner", "--learner", "1", "--connect", "127.0.0.1:1", "--key-file", str(secret_file)])
    assert ei.value.code == 2
    assert "--key-file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- through the syncer

def _push(client, seq: int, delta, incarnation: int = 1, tokens: int = TOKENS, position: int = 0) -> wire.Frame:
    return client.send(push_frame(1, incarnation, seq, delta, tokens=tokens, position=position))


def test_a_learner_with_another_learners_key_cannot_hello_as_it(rig: Rig) -> None:
    """(a) On main every learner held the secret: an impostor's HELLOs as learner 1 bumped
    its incarnation in a loop (1 -> 11) and its retried push was refused bad_incarnation."""
    s = rig.start(quorum=3, grace=3600.0)
    victim = rig.client(s)
    assert victim.hello(1, "victim").header["incarnation"] == 1
    delta = rig.delta(s, 1)
    impostor_key = learner_key(SECRET, 2)
    for attempt in range(5):
        impostor = rig.client(s, learner=1, key=impostor_key)  # opens as 1, holds key_2
        with pytest.raises((wire.FrameError, wire.PeerClosed, ConnectionError)):
            impostor.hello(1, f"impostor-{attempt}")
    poll_until(lambda: s.counters["rejected_bad_mac"] == 5, "the impostor's five HELLOs to be refused")
    rejected = [e for e in rig.events("frame_rejected") if e.get("reason") == "bad_mac"]
    assert rejected and "learner 1's key" in rejected[0]["detail"]
    with s.cond:
        assert s.members.members[1].incarnation == 1, "an impostor's HELLO must not bump the victim's incarnation"
    ack = _push(victim, 1, delta)
    assert ack.header["status"] == "accepted"


def test_a_hello_naming_another_learner_is_refused_bad_identity(rig: Rig) -> None:
    """(a) Opening honestly as learner 2, then naming learner 1 in HELLO (first or later)."""
    s = rig.start(quorum=3, grace=3600.0)
    victim = rig.client(s)
    victim.hello(1, "victim")
    liar = rig.client(s, learner=2)
    first = liar.hello(1, "victim")
    assert first.type == wire.ERROR and first.header["reason"] == "bad_identity"
    assert "learner 2's key" in first.header["detail"]
    liar.expect_closed()
    again = rig.client(s, learner=2)
    assert again.hello(2, "honest").header["incarnation"] == 1
    later = again.hello(1, "victim")
    assert later.type == wire.ERROR and later.header["reason"] == "bad_identity"
    poll_until(lambda: s.counters["rejected_bad_identity"] == 2, "two bad_identity refusals counted")
    assert [e for e in rig.events("frame_rejected") if e.get("reason") == "bad_identity"]
    with s.cond:
        assert s.members.members[1].incarnation == 1 and s.members.members[1].nonce == "victim"
    assert _push(victim, 1, rig.delta(s, 1)).header["status"] == "accepted"


def test_the_victims_nonce_gives_an_impostor_nothing(rig: Rig) -> None:
    """(b) On main an impostor reusing the victim's nonce got its incarnation and pushed
    its next seqs first: the victim's genuine pushes were answered duplicate, never merged."""
    s = rig.start(quorum=1, grace=0.0)
    victim = rig.client(s)
    assert victim.hello(1, "victim-nonce").header["incarnation"] == 1
    impostor = rig.client(s, learner=1, key=learner_key(SECRET, 2))
    with pytest.raises((wire.FrameError, wire.PeerClosed, ConnectionError)):
        impostor.hello(1, "victim-nonce")
    # As itself, a push whose header names learner 1 still counts as learner 2's (the
    # connection's identity decides), so it takes none of learner 1's ids.
    as_itself = rig.client(s)
    as_itself.hello(2, "impostor")
    forged = as_itself.send(push_frame(1, 1, 1, rig.delta(s, 99), tokens=1))
    assert forged.header["status"] == "accepted"
    for seq in (1, 2, 3):
        ack = victim.send(push_frame(1, 1, seq, rig.delta(s, seq), tokens=TOKENS - seq))
        assert ack.header["status"] == "accepted", f"the victim's push {seq} was {ack.header}"
    poll_until(lambda: sum(c["learner"] == 1 for e in rig.events("merge") for c in e["contributors"]) == 3,
               "the victim's three pushes to be merged")
    merged = [c for e in rig.events("merge") for c in e["contributors"]]
    assert sorted(c["tokens"] for c in merged if c["learner"] == 1) == [TOKENS - 3, TOKENS - 2, TOKENS - 1], \
        "the contributions under learner 1 must carry the victim's tokens"
    assert [c["tokens"] for c in merged if c["learner"] == 2] in ([], [1]), "the forged push is learner 2's own"


def test_an_absurd_data_position_is_refused_and_not_inherited(rig: Rig) -> None:
    """(c) On main a claimed position of 2^53 - 1 was kept, and the next incarnation was
    welcomed at it. Now the claim is bounded by what the incarnation can have consumed."""
    s = rig.start(quorum=3, grace=3600.0)
    c = rig.client(s)
    assert c.hello(1, "first").header["position"] == 0
    refused = c.send(push_frame(1, 1, 1, rig.delta(s, 1), position=wire.MAX_SAFE_INT))
    assert refused.type == wire.ERROR and refused.header["reason"] == "out_of_bounds"
    assert "position=" in refused.header["detail"]
    assert c.send(push_frame(1, 1, 2, rig.delta(s, 2), position=16)).header["status"] == "accepted"
    c.close()
    nxt = rig.client(s)
    welcome = nxt.hello(1, "second")
    assert welcome.header["incarnation"] == 2
    assert welcome.header["position"] == 16, "the next incarnation resumes where the last one really was"


def test_the_position_bound_is_persisted_per_incarnation() -> None:
    from trainer.membership import Member, Membership
    ms = Membership(2)
    ms.join(1, "a", conn=1, now=0.0)
    ms.members[1].position = 40
    ms.join(1, "b", conn=2, now=1.0)
    assert ms.members[1].start == 40
    assert Member.restore(1, ms.members[1].persistent()).start == 40
    assert Member.restore(1, {"position": 7}).start == 7  # state written before the bound


def test_the_key_file_line_holds_the_derived_key() -> None:
    """The key is a function of (secret, id) only: the syncer needs no state to check it."""
    assert key_file_text(SECRET, 1).split()[-1] == learner_key(SECRET, 1).hex()


def test_check_position_bounds_a_claim_by_what_the_incarnation_can_have_consumed() -> None:
    from trainer.protocol import ProtocolError
    from trainer.validation import check_position
    check_position(100 + 16, start=100, elapsed=0.0, max_step_rate=10.0, sync_every=4)  # 4 rounds of slack
    check_position(100 + 16 + 50, start=100, elapsed=5.0, max_step_rate=10.0, sync_every=4)
    with pytest.raises(ProtocolError) as ei:
        check_position(100 + 16 + 51, start=100, elapsed=5.0, max_step_rate=10.0, sync_every=4)
    assert ei.value.reason == "out_of_bounds" and "started at 100" in ei.value.detail


def test_trainer_run_hands_each_learner_only_its_own_key(tmp_path, monkeypatch) -> None:
    """`trainer run`: learner N's argv names its own key file and its environment has no secret."""
    from trainer.launch import ClusterSpec, LocalCluster
    from trainer.runspec import RunSpec
    monkeypatch.setenv("ISLANDS_SECRET", "x" * 32)
    cluster = LocalCluster(ClusterSpec(tmp_path / "run", RunSpec(learners=3)))
    spawned: list[tuple[list[str], dict]] = []
    monkeypatch.setattr(cluster, "_spawn", lambda proc, env=None: spawned.append((proc.argv, env)))
    try:
        for n in (1, 2, 3):
            cluster.start_learner(n)
    finally:
        cluster.events.close()
    secret = cluster.secret_file.read_bytes().strip()
    for n, (argv, env) in zip((1, 2, 3), spawned):
        path = argv[argv.index("--key-file") + 1]
        assert load_key_file(path, n) == learner_key(secret, n)
        assert "ISLANDS_SECRET_FILE" not in env and "ISLANDS_SECRET" not in env, n
        assert "--secret-file" not in argv


def test_the_chaos_local_backend_hands_each_learner_only_its_own_key(tmp_path, monkeypatch) -> None:
    """start() writes keys/learner-N.key before anything starts; learner N's argv names its own."""
    from chaos.backends.local import LocalCluster

    class Stop(Exception):
        pass

    def stop(self) -> None:
        raise Stop

    monkeypatch.setattr(LocalCluster, "_start_spares", stop)
    monkeypatch.setenv("ISLANDS_HOME", str(tmp_path / "home"))
    cluster = LocalCluster(tmp_path / "run")
    with pytest.raises(Stop):
        cluster.start()
    secret = (cluster.run_dir / "secret").read_bytes().strip()
    spawned: dict[str, list[str]] = {}
    monkeypatch.setattr(cluster, "_spawn", lambda name, argv: spawned.setdefault(name, argv))
    cluster.proxy_ports = {f"learner-{n}": 20000 + n for n in range(1, cluster.learners + 1)}
    for n in range(1, cluster.learners + 1):
        cluster._start_learner(n)
        argv = spawned[f"learner-{n}"]
        assert load_key_file(argv[argv.index("--key-file") + 1], n) == learner_key(secret, n)
        assert (cluster.run_dir / "keys" / f"learner-{n}.key").stat().st_mode & 0o077 == 0


def test_the_ranks_of_a_unit_share_its_key_file() -> None:
    """A multi-rank learner's ranks are one learner: each rank gets the unit's --key-file."""
    from trainer.__main__ import build_parser, rank_argv
    args = build_parser().parse_args(["learner", "--learner", "2", "--connect", "h:1", "--ranks", "2",
                                      "--key-file", "/k/learner-2.key"])
    argv = rank_argv(args, 1, "/tmp/store")
    assert argv[argv.index("--key-file") + 1] == "/k/learner-2.key" and "--secret-file" not in argv
