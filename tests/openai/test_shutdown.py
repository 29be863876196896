"""Graceful shutdown: on SIGTERM / SIGINT the server stops accepting
connections, lets requests in flight finish within --shutdown-timeout-s,
cancels the rest (a stream gets a final error event), and exits 0."""

import signal
import socket

import openai
import pytest

from conftest import wait_for


def refuses_connections(server) -> bool:
    host, port = server.base_url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return False
    except OSError:
        return True


def start_stream(server, max_tokens):
    stream = server.client().completions.create(model="kvc-default", prompt=[1, 2, 3], max_tokens=max_tokens,
                                                temperature=0, stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    first = next(it)
    return it, first


def test_idle_server_exits_zero_on_sigint(start_server):
    srv = start_server()
    assert srv.stop(signal.SIGINT, timeout_s=30) == 0


def test_sigterm_stops_accepting_and_lets_a_stream_in_flight_finish(start_server):
    srv = start_server("--shutdown-timeout-s", "120")
    chunks, first = start_stream(srv, max_tokens=30)
    srv.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: refuses_connections(srv), 30, "the listener to close")
    rest = list(chunks)
    finishes = [c.choices[0].finish_reason for c in [first, *rest] if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"], "the stream in flight was not allowed to finish"
    assert srv.proc.wait(timeout=60) == 0


def test_requests_still_running_after_the_shutdown_timeout_are_cancelled(start_server):
    srv = start_server("--shutdown-timeout-s", "1")
    chunks, _ = start_stream(srv, max_tokens=10_000)
    srv.proc.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIError) as e:
        for _ in chunks:
            pass
    assert "shutting down" in e.value.message
    assert srv.proc.wait(timeout=60) == 0
