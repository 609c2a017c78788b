"""The web app's alternatives with FakeChatService (tests/webui_fakes.py): `/again` and
`/pick` go through the same routes and store code as with the real ChatService (the fake
had no stream_again, so `/again` on a fake app was a 500), and the compare page renders."""
from __future__ import annotations

from webui_fakes import (app, build_daemon, client, daemon, fake_chat,  # noqa: F401 - fixtures
                         parse_sse)


def post(client, path, body=None, status=200):
    r = client.post(path, json=body if body is not None else {})
    assert r.status_code == status, r.get_json()
    return r.get_json()


def test_again_streams_an_alternative_in_the_same_slot_and_pick_stores_a_pair(client, store):
    first = post(client, "/api/chat", {"message": "hello there"})
    r = client.post(f"/api/turns/{first['turn_id']}/again", json={"stream": True})
    events = parse_sse(r.get_data(as_text=True))
    assert events[0][0] == "start" and events[0][1]["alternative_of"] == first["turn_id"]
    assert events[0][1]["index"] == first["index"]
    assert "".join(d["delta"] for e, d in events if e == "message") == "echo #2: hello there"
    kind, done = events[-1]
    assert kind == "done" and (done["index"], done["picked"], done["alternatives"]) == \
        (first["index"], True, 2)
    # the non-streamed form waits for the reply (ChatStream.wait)
    third = post(client, f"/api/turns/{first['turn_id']}/again")
    assert third["reply"] == "echo #3: hello there" and third["alternatives"] == 3
    listed = client.get(f"/api/turns/{done['turn_id']}/alternatives").get_json()["turns"]
    assert [(t["turn_id"], t["picked"]) for t in listed] == \
        [(first["turn_id"], False), (done["turn_id"], False), (third["turn_id"], True)]
    picked = post(client, f"/api/turns/{first['turn_id']}/pick")
    assert picked["turn"]["picked"] is True
    assert sorted((p["a"]["turn_id"], p["b"]["turn_id"], p["outcome"], p["source"])
                  for p in picked["pairs"]) == \
        [(first["turn_id"], done["turn_id"], "a", "regenerate"),
         (first["turn_id"], third["turn_id"], "a", "regenerate")]
    conv = client.get(f"/api/conversations/{first['conversation_id']}").get_json()
    assert [t["turn_id"] for t in conv["turns"]] == [first["turn_id"]]
    nxt = post(client, "/api/chat", {"message": "and then?",
                                     "conversation_id": first["conversation_id"]})
    assert nxt["index"] == first["index"] + 1 and store.counts()["pairs"] == 2


def test_again_on_an_earlier_turn_is_409_and_stores_nothing(client, store):
    first = post(client, "/api/chat", {"message": "q1"})
    post(client, "/api/chat", {"message": "q2", "conversation_id": first["conversation_id"]})
    r = client.post(f"/api/turns/{first['turn_id']}/again", json={"stream": True})
    assert r.status_code == 409 and "last" in r.get_json()["error"]
    assert store.counts()["turns"] == 2
    assert client.post("/api/turns/999/again", json={}).status_code == 404


def test_the_compare_page_renders_in_the_nav_without_inline_script(client):
    r = client.get("/compare")
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and 'id="compare-form"' in html
    assert 'href="/compare" aria-current="page">Compare</a>' in html
    assert "<script>" not in html and "/static/compare.js" in html
    assert 'href="/compare" >Compare</a>' in client.get("/history").get_data(as_text=True)
