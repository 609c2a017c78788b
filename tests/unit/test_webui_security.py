"""docs/design.md §9 through the test client: Host allow-list, auth token, CSRF, size limits,
headers. The same checks are exercised over real HTTP in tests/e2e/test_api_security.py."""
from __future__ import annotations

import io

import pytest

from reinf.errors import ConfigError
from webui_fakes import app, build_daemon, client, daemon, fake_chat  # noqa: F401 - fixtures


def make_client(config, store, fake_chat, daemon, **settings):
    from webui import create_app

    return create_app(config.replace(**settings), store=store, chat=fake_chat,
                      daemon=daemon).test_client()


# --- Host header (DNS rebinding) -----------------------------------------------------

@pytest.mark.parametrize("host", ["localhost", "localhost:8765", "127.0.0.1:8765",
                                  "[::1]:8765", "127.0.0.5", "LOCALHOST:1"])
def test_local_host_names_are_accepted(client, host):
    assert client.get("/api/ping", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "localhost.evil.example:8765",
                                  "192.168.1.7:8765", "rebind.attacker.test", "[::2]"])
def test_other_host_names_are_400_before_anything_runs(client, store, host):
    r = client.post("/api/chat", json={"message": "hi"}, headers={"Host": host})
    assert r.status_code == 400
    assert "not an allowed name" in r.get_json()["error"] and "allowed_hosts" in r.get_json()["fix"]
    assert client.get("/", headers={"Host": host}).status_code == 400
    assert store.counts()["turns"] == 0


@pytest.mark.parametrize("host", ["[::1]evil", "localhost:8773/..", "localhost:8765@evil.example",
                                  "127.0.0.1:80:80", "localhost:port", "::1", "[::1]:8765x",
                                  "localhost/x", "localhost 127.0.0.1"])
def test_malformed_host_headers_are_400(client, store, host):
    """Something after the name or port must not be ignored: "[::1]evil" is not [::1]."""
    r = client.post("/api/chat", json={"message": "hi"}, headers={"Host": host})
    assert r.status_code == 400, host
    assert "not a valid host name" in r.get_json()["error"]
    assert client.get("/", headers={"Host": host}).status_code == 400
    assert store.counts()["turns"] == 0


def test_allowed_hosts_extends_the_list(config, store, fake_chat, daemon):
    c = make_client(config, store, fake_chat, daemon, allowed_hosts=["reinf.lan"])
    assert c.get("/api/ping", headers={"Host": "reinf.lan:8765"}).status_code == 200
    assert c.get("/api/ping", headers={"Host": "other.lan"}).status_code == 400


def test_binding_off_loopback_without_a_token_is_refused(config):
    with pytest.raises(ConfigError, match="auth_token"):
        config.replace(host="0.0.0.0")


# --- auth token ----------------------------------------------------------------------

@pytest.fixture
def locked(config, store, fake_chat, daemon):
    return make_client(config, store, fake_chat, daemon, host="0.0.0.0",
                       auth_token="s3cret-token-0123")


@pytest.mark.parametrize("path", ["/api/status", "/api/history", "/v1/models"])
def test_api_without_the_token_is_401(locked, path):
    r = locked.get(path)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    assert "auth token" in (r.get_json()["error"] if path.startswith("/api")
                            else r.get_json()["error"]["message"])
    assert locked.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = locked.get(path, headers={"Authorization": "Bearer s3cret-token-0123"})
    assert ok.status_code == 200


def test_a_client_without_the_right_token_is_told_so(config, store, fake_chat, daemon, invoke,
                                                    monkeypatch):
    """`reinf chat --url` against a server that answered 401 said "no Reinf daemon answers"."""
    from reinf.daemon.remote import TokenRefused, find_server
    from webui import create_app
    from webui.server import BackgroundServer

    token = "s3cret-token-0123"
    app = create_app(config.replace(auth_token=token), store=store, chat=fake_chat,
                     daemon=daemon)
    with BackgroundServer(app, threads=2) as server:
        with pytest.raises(TokenRefused, match="needs an auth token, and none is set") as info:
            find_server(config, server.url)
        assert "REINF_AUTH_TOKEN" in info.value.fix
        with pytest.raises(TokenRefused, match="refused the auth token"):
            find_server(config.replace(auth_token="wrong-token-45678"), server.url)
        assert find_server(config.replace(auth_token=token), server.url) == server.url
        result = invoke("chat", "--url", server.url, "--once", "hi")
        assert result.exit_code == 1 and "no Reinf daemon answers" not in result.output
        assert f"reinf serve at {server.url} needs an auth token" in result.output
    assert store.counts()["turns"] == 0


def test_writes_without_the_token_are_401_and_store_nothing(locked, store):
    r = locked.post("/api/chat", json={"message": "hi"})
    assert r.status_code == 401 and store.counts()["turns"] == 0


def test_off_loopback_any_ip_host_is_accepted_but_names_are_not(locked):
    auth = {"Authorization": "Bearer s3cret-token-0123"}
    assert locked.get("/api/ping", headers={**auth, "Host": "192.168.1.7:8765"}).status_code == 200
    assert locked.get("/api/ping", headers={**auth, "Host": "evil.example"}).status_code == 400


def test_pages_redirect_to_login_and_the_cookie_unlocks_them(locked):
    r = locked.get("/history")
    assert r.status_code == 302 and r.headers["Location"].startswith("/login?next=")
    css = locked.get("/static/style.css")
    assert css.status_code == 200
    css.close()
    page = locked.get("/login").get_data(as_text=True)
    csrf = locked.application.extensions["reinf"].guard.csrf_token
    assert csrf in page
    bad = locked.post("/login", data={"token": "nope", "csrf": csrf, "next": "/history"})
    assert bad.status_code == 401 and "not right" in bad.get_data(as_text=True)
    no_csrf = locked.post("/login", data={"token": "s3cret-token-0123"})
    assert no_csrf.status_code == 415 or no_csrf.status_code == 403
    good = locked.post("/login", data={"token": "s3cret-token-0123", "csrf": csrf,
                                       "next": "//evil.example/x"})
    assert good.status_code == 302 and good.headers["Location"] == "/"
    cookie = good.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert locked.get("/history").status_code == 200
    assert locked.get("/api/status").status_code == 200  # the cookie authenticates the page
    # a browser with the cookie still needs the CSRF header to change anything
    assert locked.post("/api/chat", json={"message": "x"}).status_code == 403
    r = locked.post("/api/chat", json={"message": "x"}, headers={"X-Reinf-CSRF": csrf})
    assert r.status_code == 200


def test_chromium_signs_in_and_out_with_origin_null(locked):
    """With Referrer-Policy: no-referrer, Chromium posts the login form with Origin: null
    and Sec-Fetch-Site: same-origin; that, with the form's CSRF token, signs in. A null
    origin from anywhere else is still refused."""
    csrf = locked.application.extensions["reinf"].guard.csrf_token
    browser = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
    good = locked.post("/login", data={"token": "s3cret-token-0123", "csrf": csrf},
                       headers=browser)
    assert good.status_code == 302 and good.headers["Location"] == "/"
    page = locked.get("/history").get_data(as_text=True)
    assert 'id="logout"' in page  # a way out, on every page
    out = locked.post("/logout", data={"csrf": csrf}, headers=browser)
    assert out.status_code == 302 and out.headers["Location"] == "/login"
    assert locked.get("/history").status_code == 302  # signed out
    for site in ("cross-site", "same-site", None):
        headers = {"Origin": "null", **({"Sec-Fetch-Site": site} if site else {})}
        r = locked.post("/login", data={"token": "s3cret-token-0123", "csrf": csrf},
                        headers=headers)
        assert r.status_code == 403, site
    forged = locked.post("/login", data={"token": "s3cret-token-0123", "csrf": "x" * 32},
                         headers=browser)
    assert forged.status_code == 403  # the null origin still needs the page's token


@pytest.mark.parametrize("given", [
    "/%09/evil.example", "/%0d%0aX:1", "/%0aSet-Cookie:x=1", "//evil.example", "///evil.example",
    "/%5Cevil.example", "/%5C%5Cevil.example", "%2F%2Fevil.example", "/%2F%2Fevil.example",
    "/%252F%252Fevil.example", "/%20/evil.example", "%20//evil.example", "/%E2%80%8B/evil.example",
    "/%E3%80%80/evil.example", "https://evil.example/x", "https:evil.example",
    "javascript:alert(1)", "/x?to=https://evil.example", "evil.example", "%00//evil.example",
])
def test_login_redirects_only_to_a_same_site_path(locked, client, given):
    csrf = locked.application.extensions["reinf"].guard.csrf_token
    page = locked.get(f"/login?next={given}")
    assert page.status_code == 200
    assert 'name="next" value="/"' in page.get_data(as_text=True)
    r = locked.post(f"/login?next={given}", data={"token": "s3cret-token-0123", "csrf": csrf})
    assert r.status_code == 302 and r.headers["Location"] == "/", r.headers["Location"]
    r = client.get(f"/login?next={given}")  # without a token, /login redirects at once
    assert r.status_code == 302 and r.headers["Location"] == "/", r.headers["Location"]


@pytest.mark.parametrize("given, expected", [
    ("/history", "/history"), ("/history?tag=too%20long", "/history?tag=too%20long"),
    ("/training#runs", "/training#runs"), ("/", "/"), ("", "/"),
])
def test_login_still_returns_to_the_page_asked_for(client, given, expected):
    r = client.get("/login", query_string={"next": given} if given else None)
    assert r.status_code == 302 and r.headers["Location"] == expected


# --- CSRF ----------------------------------------------------------------------------

def csrf_of(client) -> str:
    return client.application.extensions["reinf"].guard.csrf_token


@pytest.mark.parametrize("headers, status, needle", [
    ({"Origin": "http://evil.example"}, 403, "cross-site request from http://evil.example"),
    ({"Origin": "null"}, 403, "cross-site"),
    ({"Origin": "http://localhost:9999"}, 403, "cross-site"),
    ({"Sec-Fetch-Site": "cross-site"}, 403, "cross-site request refused"),
    ({"Sec-Fetch-Site": "same-site"}, 403, "same-site request refused"),
    ({"Origin": "http://localhost"}, 403, "missing security token"),
    ({"Cookie": "x=1"}, 403, "missing security token"),
    ({"Sec-Fetch-Site": "same-origin"}, 403, "missing security token"),
    ({"X-Reinf-CSRF": "stale"}, 403, "out of date"),
])
def test_state_changing_browser_requests_need_the_csrf_token(client, store, headers, status,
                                                            needle):
    if "Cookie" in headers:  # the test client sends cookies from its jar only
        name, value = headers.pop("Cookie").split("=")
        client.set_cookie(name, value)
    r = client.post("/api/chat", json={"message": "hi"}, headers=headers)
    assert r.status_code == status and needle in r.get_json()["error"]
    tid = store.append_turn(store.create_conversation().id, "q", "a").id
    r = client.put(f"/api/turns/{tid}/rating", json={"score": 5}, headers=headers)
    assert r.status_code == status and store.get_turn(tid).rating is None
    assert client.delete(f"/api/turns/{tid}", headers=headers).status_code == status
    assert store.counts()["turns"] == 1


def test_the_page_token_with_a_same_origin_header_passes(client):
    r = client.post("/api/chat", json={"message": "hi"},
                    headers={"X-Reinf-CSRF": csrf_of(client), "Origin": "http://localhost",
                             "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 200


def test_non_browser_clients_must_send_json(client, store):
    assert client.post("/api/chat", json={"message": "hi"}).status_code == 200
    r = client.post("/api/chat", data={"message": "hi"})  # an HTML form's encoding
    assert r.status_code == 415 and "application/json" in r.get_json()["fix"]
    r = client.post("/api/chat", data='{"message": "hi"}', content_type="text/plain")
    assert r.status_code == 415 and store.counts()["turns"] == 1


def test_reads_need_no_csrf_token(client):
    assert client.get("/api/history", headers={"Origin": "http://evil.example"}).status_code == 200


# --- sizes ---------------------------------------------------------------------------

def test_an_oversize_body_is_413_with_a_message(config, store, fake_chat, daemon):
    c = make_client(config, store, fake_chat, daemon, max_request_bytes=2048)
    r = c.post("/api/chat", json={"message": "x" * 5000})
    assert r.status_code == 413
    body = r.get_json()
    assert "limit is 2048 bytes" in body["error"] and "max_request_bytes" in body["fix"]
    assert store.counts()["turns"] == 0


def test_an_oversize_chunked_body_is_413(config, store, fake_chat, daemon):
    c = make_client(config, store, fake_chat, daemon, max_request_bytes=2048)

    body = io.BytesIO(b'{"message": "' + b"x" * 5000 + b'"}')
    r = c.post("/api/chat", input_stream=body, content_type="application/json",
               headers={"Transfer-Encoding": "chunked"},
               environ_overrides={"wsgi.input_terminated": True})
    assert r.status_code == 413 and "too large" in r.get_json()["error"]
    assert store.counts()["turns"] == 0


# --- headers -------------------------------------------------------------------------

def test_api_responses_carry_the_security_headers(client):
    for r in (client.get("/api/status"), client.get("/api/nope"),
              client.post("/api/chat", json={"message": "x"}, headers={"Origin": "http://e.x"})):
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
        assert r.headers["Cache-Control"] == "no-store"
        assert "Access-Control-Allow-Origin" not in r.headers
