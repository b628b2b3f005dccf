"""Device identity in a `splitroom join` room with a key (``?key=`` in the room URL):
each device's hello carries an HMAC of the key over its id and the fingerprint of the
DTLS certificate on that connection. A peer that takes a device's id at the relay
before the real device does (an impostor) cannot make that proof: without the key, or
with the key stolen but over a certificate that is not its own, the host refuses it,
logs why, and exits 3 naming it instead of taking it for the device."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from runtime.control import Hello, encode_control, room_proof
from runtime.transport import connect_room
from splitroom.join_cmd import parse_room_url
from tests.joinroom import SPLITROOM, relay_room

pytestmark = pytest.mark.slow

KEY = "test-room-key-0123456789"


async def _impostor(url: str, proof_of) -> None:
    """Take the id ``w`` in the room, say a hello with ``proof_of(local fingerprint)``,
    then stay connected a while."""
    relay, room = parse_room_url(url)
    # seated at the relay with the room's tag, as a relay that does not check (or a hostile
    # one) would seat it: the proof in the hello is what is tested here
    t = await connect_room(relay, room, "w", ["h"], host_addresses=["127.0.0.1"], open_timeout_s=40, room_key=KEY)
    try:
        local, _ = t.fingerprints("h")
        assert local and local.startswith("sha-256 ")
        await t.send("h", "reply", encode_control(Hello(device="w", layers=(15, 30), proof=proof_of(local))))
        await asyncio.sleep(20)
    finally:
        await t.close()


@pytest.mark.parametrize("case", ["no key", "wrong key", "key over another certificate"])
def test_an_impostor_that_cannot_prove_the_room_key_is_refused(case):
    proofs = {"no key": lambda fp: None,
              "wrong key": lambda fp: room_proof("another-key-0123456789", "w", fp),
              "key over another certificate": lambda fp: room_proof(KEY, "w", "sha-256 " + ":".join(["AB"] * 32))}
    with relay_room("identity") as (url, env, procs):
        url += f"?key={KEY}"
        host = subprocess.Popen(SPLITROOM + ["join", url, "--device", "h", "--host", "--layers", "1-15", "--peers", "w",
                                             "--ask", "Hi", "--address", "127.0.0.1", "--timeout", "50"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(host)

        async def go():
            imp = asyncio.ensure_future(_impostor(url, proofs[case]))
            while host.poll() is None and not imp.done():
                await asyncio.sleep(0.2)
            imp.cancel()
        asyncio.run(go())
        _, err = host.communicate(timeout=30)
    assert host.returncode == 3, err
    assert "refused the hello of w" in err  # logged
    assert "refused w:" in err and ("no proof" in err if case == "no key" else "does not match" in err)
