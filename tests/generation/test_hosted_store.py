"""The weight-transfer store listens on the interface it was asked for only (the probe found torch's TCPStore server
on every interface when asked for 127.0.0.1)."""

import datetime

import torch.distributed as tdist

from grpokit.generation.vllm_common import hosted_store

LISTEN = "0A"  # the TCP state "listening" in /proc/net/tcp


def _listening_addresses(port: int) -> set[str]:
    """The local addresses (as /proc/net/tcp{,6} write them, hex) of the sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.rpartition(":")
                if state == LISTEN and int(hex_port, 16) == port:
                    found.add(address)
    return found


def test_the_store_listens_on_loopback_only_and_serves_clients():
    timeout = datetime.timedelta(seconds=10)
    store = hosted_store("127.0.0.1", 0, timeout)
    assert _listening_addresses(store.port) == {"0100007F"}  # 127.0.0.1, little-endian hex; not 00000000 (any)
    client = tdist.TCPStore("127.0.0.1", store.port, None, False, timeout, wait_for_workers=False)
    client.set("weights", "v1")
    assert store.get("weights") == b"v1"


def test_torch_alone_listens_everywhere():
    # Why hosted_store exists: the same request to torch's store binds the wildcard address.
    store = tdist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    assert _listening_addresses(store.port) & {"00000000", "00000000000000000000000000000000"}
