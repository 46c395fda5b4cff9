"""`port: auto` picks outside the kernel's ephemeral range (tuner.ports), so an outgoing
connection's source port can never take a restarted backend's port."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from tuner.config.experiment import free_port as exported
from tuner.ports import LOWEST, auto_range, ephemeral_range, free_port


def range_file(tmp_path: Path, low: int, high: int) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{low}\t{high}\n")
    return path


def test_the_pick_is_below_this_machines_ephemeral_range_and_bindable() -> None:
    low, high = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert LOWEST <= port < low or high < port <= 65535, (port, low, high)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert exported is free_port  # the experiment's `port: auto` uses it


def test_outgoing_connections_do_not_take_the_picked_ports() -> None:
    # what took a restarted backend's port in the full suite: a client's source port
    low, high = ephemeral_range()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        clients = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            sources = {c.getsockname()[1] for c in clients}
        finally:
            for c in clients:
                c.close()
    assert all(low <= p <= high for p in sources)
    assert auto_range() is not None and not sources & set(auto_range() or ())


def test_a_port_in_use_is_never_returned(tmp_path: Path) -> None:
    path = range_file(tmp_path, 60000, 60999)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        held.listen(1)
        seq = iter([busy, busy])

        class Rigged(random.Random):
            def choice(self, seq_: object) -> int:  # type: ignore[override]
                return next(seq, 20001)

        assert free_port(path=path, rng=Rigged()) == 20001


def test_the_range_file_decides_the_side_and_a_missing_file_means_ianas(tmp_path: Path) -> None:
    assert auto_range(range_file(tmp_path, 32768, 60999)) == range(LOWEST, 32768)
    assert auto_range(range_file(tmp_path, 10500, 60000)) == range(60001, 65536)  # too little room below
    assert auto_range(range_file(tmp_path, 1024, 65000)) is None  # no room: the kernel picks
    assert ephemeral_range(tmp_path / "absent") == (49152, 65535)
    port = free_port(path=range_file(tmp_path, 1024, 65000))
    assert 1 <= port <= 65535
