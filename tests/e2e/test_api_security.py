"""docs/design.md §9 over real HTTP: loopback bind, Host allow-list, auth token, CSRF, headers."""
from __future__ import annotations

import socket

import pytest
import requests

from webui_fakes import (FakeChatService, app, build_daemon, daemon,  # noqa: F401 - fixtures
                         fake_chat, live)

pytestmark = pytest.mark.e2e


def outside_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.254.254.254", 1))  # UDP connect sends nothing
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_the_server_binds_loopback_by_default(config, store, daemon):
    from webui import create_app
    from webui.server import BackgroundServer

    assert config.server.host == "127.0.0.1"
    app = create_app(config, store=store, chat=FakeChatService(store), daemon=daemon)
    with BackgroundServer(app, host=config.server.host) as server:
        assert server.server.socket.getsockname()[0] == "127.0.0.1"
        assert requests.get(server.url + "/api/ping", timeout=5).status_code == 200
        other = outside_address()
        if other is not None:  # from another interface, nothing listens
            with pytest.raises(OSError):
                socket.create_connection((other, server.port), timeout=2).close()


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "localhost.evil.example"])
def test_a_foreign_host_header_is_400(live, store, host):
    r = requests.post(live.url + "/api/chat", json={"message": "hi"}, headers={"Host": host},
                      timeout=5)
    assert r.status_code == 400 and "not an allowed name" in r.json()["error"]
    assert requests.get(live.url + "/", headers={"Host": host}, timeout=5).status_code == 400
    assert store.counts()["turns"] == 0
    ok = requests.get(live.url + "/api/ping", headers={"Host": f"localhost:{live.port}"},
                      timeout=5)
    assert ok.status_code == 200


@pytest.mark.parametrize("bind_setting", ["0.0.0.0", "127.0.0.1"])
def test_with_an_auth_token_requests_need_it(config, store, daemon, bind_setting):
    from webui import create_app
    from webui.server import BackgroundServer

    cfg = config.replace(host=bind_setting, auth_token="tok-123-0123456789")
    app = create_app(cfg, store=store, chat=FakeChatService(store), daemon=daemon)
    # Bound to loopback in the test either way; the app applies the config's rules.
    with BackgroundServer(app) as server:
        r = requests.post(server.url + "/api/chat", json={"message": "hi"}, timeout=5)
        assert r.status_code == 401 and "auth token" in r.json()["error"]
        assert requests.get(server.url + "/v1/models", timeout=5).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert requests.get(server.url + "/api/status", headers=bad, timeout=5).status_code == 401
        assert store.counts()["turns"] == 0
        good = {"Authorization": "Bearer tok-123-0123456789"}
        r = requests.post(server.url + "/api/chat", json={"message": "hi"}, headers=good,
                          timeout=5)
        assert r.status_code == 200 and store.counts()["turns"] == 1
        page = requests.get(server.url + "/training", allow_redirects=False, timeout=5)
        assert page.status_code == 302 and "/login" in page.headers["Location"]


def test_cross_site_writes_are_403_and_same_origin_pages_work(live, app, store):
    tid = store.append_turn(store.create_conversation().id, "q", "a").id
    url = f"{live.url}/api/turns/{tid}/rating"
    for headers in ({"Origin": "http://evil.example"},
                    {"Origin": live.url, "Sec-Fetch-Site": "cross-site"},
                    {"Origin": live.url}):  # same origin, but no page token
        r = requests.put(url, json={"score": 5}, headers=headers, timeout=5)
        assert r.status_code == 403, headers
    assert store.get_turn(tid).rating is None
    # a cross-site HTML form (url-encoded, no Origin on old browsers) is refused too
    r = requests.post(live.url + "/api/chat", data={"message": "hi"}, timeout=5)
    assert r.status_code == 415 and store.counts()["turns"] == 1
    token = app.extensions["reinf"].guard.csrf_token
    page = requests.get(live.url + "/", timeout=5).text
    assert token in page
    r = requests.put(url, json={"score": 5}, timeout=5,
                     headers={"Origin": live.url, "X-Reinf-CSRF": token,
                              "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 200 and store.get_turn(tid).rating.score == 5


def test_security_headers_over_http(live):
    for path in ("/", "/history", "/training", "/api/status", "/static/chat.js"):
        r = requests.get(live.url + path, timeout=5)
        csp = r.headers["Content-Security-Policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Referrer-Policy"] == "no-referrer"
        assert "Access-Control-Allow-Origin" not in r.headers


@pytest.mark.parametrize("times", [2, 10])
def test_an_oversize_body_from_urllib_is_a_json_413_not_a_reset(live, app, store, times):
    """Python's urllib sends the whole body before it reads the answer. The server reads
    it (dropping it, up to a bound) and answers Reinf's JSON 413 naming the setting,
    instead of closing while the client still sends (a connection reset): at twice the
    limit, and at ten times, past what waitress buffers."""
    import json
    import urllib.error
    import urllib.request

    limit = app.config["MAX_CONTENT_LENGTH"]
    body = b'{"message": "' + b"x" * (limit * times) + b'"}'
    request = urllib.request.Request(live.url + "/api/chat", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:  # not URLError(ConnectionResetError)
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 413
    error = json.loads(info.value.read())
    info.value.close()
    assert error["key"] == "max_request_bytes" and f"the limit is {limit} bytes" in error["error"]
    assert "max_request_bytes" in error["fix"]
    assert store.counts()["turns"] == 0
    with urllib.request.urlopen(live.url + "/api/ping", timeout=10) as ok:  # still serving
        assert ok.status == 200


def raw_chunked(port: int, path: str, total: int, *, end: bool = True,
                then: bytes = b"") -> tuple[bytes, bytes]:
    """POST ``total`` bytes to ``path`` as a chunked body over a raw socket (the last chunk
    only if ``end``), then ``then`` on the same connection; (first response, the rest)."""
    import json

    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        body = b'{"message": "' + b"x" * total
        try:
            for start in range(0, len(body), 8192):
                piece = body[start:start + 8192]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            if end:
                sock.sendall(b'3\r\n"}\n\r\n0\r\n\r\n' + then)
        except (ConnectionResetError, BrokenPipeError):
            # far past the limit the server answers without reading the rest and closes,
            # which can reset the connection before the client stops sending; the answer it
            # sent first is still read below, as a client that watches for an early
            # response reads it
            pass
        data = b""
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            assert more, f"closed without an answer after {data!r}"
            data += more
        head, rest = data.split(b"\r\n\r\n", 1)
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), None)
        assert length is not None, data  # waitress's plain text is chunked, with no length
        while len(rest) < length:
            more = sock.recv(65536)
            assert more, head
            rest += more
        first, rest = head + b"\r\n\r\n" + rest[:length], rest[length:]
        if then:
            sock.settimeout(10)
            while b"\r\n\r\n" not in rest or not rest.rstrip().endswith(b"}"):
                more = sock.recv(65536)
                if not more:
                    break
                rest += more
        json.loads(first.split(b"\r\n\r\n", 1)[1])  # JSON, not waitress's plain text
        return first, rest


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
def test_an_oversize_chunked_body_is_a_json_413_naming_the_setting(config, store, fake_chat,
                                                                    daemon, path):
    """A chunked body (no Content-Length) past what waitress buffers got waitress's plain
    text 413. It is Reinf's JSON 413 naming max_request_bytes: just over the limit, past
    the buffer (the body is read and dropped, the connection stays usable), and far past
    it (answered without the rest, then closed)."""
    import json

    from webui import create_app
    from webui.server import BODY_MARGIN, DRAIN_FACTOR, BackgroundServer

    limit = 4096
    app = create_app(config.replace(max_request_bytes=limit), store=store, chat=fake_chat,
                     daemon=daemon)
    ping = b"GET /api/ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with BackgroundServer(app) as server:
        for total, end in ((limit * 2, True), (limit + BODY_MARGIN + 20_000, True),
                           (limit * DRAIN_FACTOR + BODY_MARGIN + 20_000, False)):
            first, rest = raw_chunked(server.port, path, total, end=end,
                                      then=ping if end else b"")
            assert first.startswith(b"HTTP/1.1 413"), first[:300]
            error = json.loads(first.split(b"\r\n\r\n", 1)[1])
            error = error["error"] if path.startswith("/v1") else error
            assert (error.get("key") or error.get("param")) == "max_request_bytes", error
            assert f"the limit is {limit} bytes" in (error.get("error") or error["message"])
            if end:  # the connection still serves the next request
                assert rest.startswith(b"HTTP/1.1 200"), rest[:300]
            else:
                assert b"connection: close" in first.lower()
    assert store.counts()["turns"] == 0
