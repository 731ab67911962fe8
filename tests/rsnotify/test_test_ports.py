"""The suite's own port picker: several ports taken before any server binds them are distinct
(a Sentinel group takes six at once; two nodes given one port would fail to start)."""
from __future__ import annotations

import socket

from tests.support.ports import free_port, worker_block


def test_ports_taken_before_any_is_bound_are_distinct() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    block = worker_block()
    assert all(port in block for port in ports)


def test_a_port_in_use_is_never_given() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        taken = held.getsockname()[1]
        assert taken not in [free_port() for _ in range(300)]
