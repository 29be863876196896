"""Issue 31 (item 4): requests that are not valid HTTP/1.1 are answered with
OpenAI's error JSON, not with hyper's empty head or a silent close: a
malformed request line or header (400), a head over the limit (431), a URI
over the limit (414), an HTTP/2 prior-knowledge preface (505), a first head
that stalls (408). Raw sockets, since HTTP clients will not send these.
Valid traffic passes through unchanged."""

import json
import re
import socket
import time

import httpx
import pytest

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# An empty SETTINGS frame, as h2 clients send right after the preface.
H2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def port_of(server) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


def exchange(port: int, data: bytes, wait_s: float = 20) -> bytes:
    """Sends `data` on a fresh connection (the server may stop reading
    early) and reads until the server closes it or `wait_s` passes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait_s)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            got += chunk
        return got
    finally:
        s.close()


def parse(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """(status line, headers by lower-case name, body) of one response."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete head in {raw!r}"
    line, *fields = head.decode("latin-1").split("\r\n")
    headers = {}
    for f in fields:
        name, _, value = f.partition(":")
        headers[name.strip().lower()] = value.strip()
    return line, headers, body


def assert_error_json(raw: bytes, statuses: tuple[int, ...], code: str | None = None) -> dict:
    line, headers, body = parse(raw)
    m = re.fullmatch(r"HTTP/1\.1 (\d{3}) .+", line)
    assert m and int(m.group(1)) in statuses, f"{line!r} not one of {statuses}: {raw[:300]!r}"
    assert headers.get("content-type") == "application/json", headers
    assert headers.get("connection") == "close", headers
    assert int(headers["content-length"]) == len(body), (headers, body)
    assert "date" in headers, headers
    err = json.loads(body)["error"]
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] == "invalid_request_error" and err["param"] is None, err
    if code is not None:
        assert err["code"] == code, err
    return err


def assert_healthy(server):
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize("request_line", [
    b"G\x00T /health HTTP/1.1",
    b"GET GET GET /health HTTP/1.1",
    b"\x00\x01\x02\x03 / HTTP/1.1",
    b"GET /health HTTP/9.9",
], ids=["nul-in-method", "spaces", "binary", "version"])
def test_a_malformed_request_line_is_400_json(server, request_line):
    raw = exchange(port_of(server), request_line + b"\r\nhost: x\r\n\r\n")
    assert_error_json(raw, (400,), "malformed_request")
    assert_healthy(server)


def test_an_invalid_header_name_is_400_json(server):
    raw = exchange(port_of(server), b"GET /health HTTP/1.1\r\nhost: x\r\nbad header: y\r\n\r\n")
    assert_error_json(raw, (400,), "malformed_request")
    assert_healthy(server)


def test_a_megabyte_of_headers_is_431_json(server):
    pad = b"".join(b"x-pad-%d: %s\r\n" % (i, b"a" * 100) for i in range(10_000))
    assert len(pad) > 1_000_000
    raw = exchange(port_of(server), b"GET /health HTTP/1.1\r\nhost: x\r\n" + pad + b"\r\n")
    assert_error_json(raw, (431,), "request_header_fields_too_large")
    assert_healthy(server)


def test_a_100kb_uri_is_refused_with_json(server):
    raw = exchange(port_of(server), b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    assert_error_json(raw, (414, 431))
    assert_healthy(server)


def test_an_http2_preface_is_505_json(server):
    raw = exchange(port_of(server), H2_PREFACE + H2_SETTINGS)
    err = assert_error_json(raw, (505,), "http_version_not_supported")
    assert "HTTP/1.1" in err["message"], err
    assert_healthy(server)


def read_response(s: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    """One whole response (by its content-length) from `s`, and what came after it."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed mid-head: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = int(parse(head + b"\r\n\r\n")[1]["content-length"])
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk, "closed mid-body"
        rest += chunk
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


def test_keep_alive_requests_pass_through_unchanged(server):
    """Two GETs of /health on one connection, one after the other and then
    pipelined: each answered, with the bytes the server's handler makes
    (the same as a plain client sees), nothing more, the connection kept."""
    expected = httpx.get(f"{server.base_url}/health", timeout=10)
    get = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", port_of(server)), timeout=10)
    try:
        answers, rest = [], b""
        for _ in range(2):
            s.sendall(get)
            answer, rest = read_response(s, rest)
            answers.append(answer)
        s.sendall(get + get)
        for _ in range(2):
            answer, rest = read_response(s, rest)
            answers.append(answer)
        assert rest == b""
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(1)  # nothing more, and still open
    finally:
        s.close()
    masked = {re.sub(rb"\r\ndate: [^\r]*", b"\r\ndate: -", a) for a in answers}
    assert len(masked) == 1, masked
    line, headers, body = parse(answers[0])
    assert line == "HTTP/1.1 200 OK" and body == expected.content, answers[0]
    assert {k: v for k, v in headers.items() if k != "date"} == {k: v for k, v in expected.headers.items() if k != "date"}


@pytest.fixture(scope="module")
def quick_timeout(start_server):
    return start_server("--header-read-timeout-s", "1")


def test_a_stalled_first_head_is_408_json_but_idle_connections_close_silently(quick_timeout):
    port = port_of(quick_timeout)
    raw = exchange(port, b"GET /health HTTP/1.1\r\nhost: x\r\n")
    assert_error_json(raw, (408,), "request_header_timeout")
    # Nothing sent: closed with nothing.
    assert exchange(port, b"") == b""
    # Idle after an answer (a pooled keep-alive connection), even with part of
    # a next head: the one answer, then closed with nothing more.
    raw = exchange(port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /hea")
    assert raw.count(b"HTTP/1.1 ") == 1 and parse(raw)[0] == "HTTP/1.1 200 OK", raw
    assert_healthy(quick_timeout)
