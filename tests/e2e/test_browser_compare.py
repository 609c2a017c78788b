"""Compare and regenerate in a real headless Chromium, against the real engine on a tiny
random Qwen2 (tests/tiny.py) with random LoRA checkpoints (the fixtures of test_compare.py:
r0001-test active, with a rating model; r0002-test another checkpoint).

The Compare page: a typed prompt gives two replies, blind; the pick stores the pair with the
right winner and loser checkpoints and reveals them; a recent message against a third
checkpoint, not blind, and a tie; the bare base with no checkpoint to compare is one line in
the page, and without a rating model each reply says so; no model at all is one line too.
The chat page: Regenerate gives a second reply in the same place (2/2), paging back to 1/2
and "Use this reply" picks it, and the next message's stored context holds the picked
reply. Screenshots go to test-artifacts/.
"""
from __future__ import annotations

import shutil

import pytest
import requests

from test_browser import (ARTIFACTS, browser, build_driver, latest_turn,  # noqa: F401
                          send, wait)
from test_compare import engine, served, server, tiny  # noqa: F401 - fixtures
from webui_fakes import app, build_daemon, daemon, fake_chat, live  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e


def cards(driver, n: int):
    """The compare page's reply cards, once there are ``n``."""
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, "#compare-replies .compare-reply")
    return found if len(found) == n else None


def text_of(driver, element) -> str:
    """The element's exact text (Selenium's .text folds whitespace)."""
    return driver.execute_script("return arguments[0].textContent", element)


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and "favicon" not in e["message"]]


def test_compare_blind_then_pick_stores_the_winner_and_reveals(browser, server, store,
                                                              tmp_path):
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(exist_ok=True)
    browser.get(server.url + "/compare")
    box = wait(browser, lambda d: d.find_element(By.ID, "compare-prompt"))
    assert browser.find_element(By.ID, "compare-blind").is_selected()  # blind by default
    box.send_keys("Why is the sky blue?")
    browser.find_element(By.ID, "compare-go").click()
    a, b = wait(browser, lambda d: cards(d, 2), timeout=120)
    assert [c.get_attribute("data-slot") for c in (a, b)] == ["A", "B"]
    for card in (a, b):  # blind: nothing says which is which
        assert card.get_attribute("data-checkpoint") is None
        assert card.find_element(By.CSS_SELECTOR, ".compare-source").text == \
            "hidden until you pick"
        # r0001-test, the checkpoint served, holds a rating model: a predicted score
        assert card.find_element(By.CSS_SELECTOR, ".predicted").text.startswith(
            "predicted rating ")
    shown = {c.get_attribute("data-slot"): text_of(browser, c.find_element(By.CSS_SELECTOR,
                                                                            ".text"))
             for c in (a, b)}
    browser.save_screenshot(str(ARTIFACTS / "compare.png"))

    b.find_element(By.CSS_SELECTOR, "button[data-pick='B']").click()
    outcome = wait(browser, lambda d: (lambda t: t if t.startswith("Stored 1 pair") else None)(
        d.find_element(By.ID, "compare-outcome").text))
    a, b = cards(browser, 2)
    revealed = {c.get_attribute("data-slot"): c.get_attribute("data-checkpoint") for c in (a, b)}
    assert sorted(revealed.values()) == ["base", "r0001-test"]
    assert "winner" in b.get_attribute("class") and "winner" not in a.get_attribute("class")
    assert "your pick" in b.text
    source = {"base": "base model", "r0001-test": "active checkpoint r0001-test"}
    assert f"B ({source[revealed['B']]}) is better than A ({source[revealed['A']]})" in outcome
    # picked: no pick buttons are left, and "Compare this prompt again" is offered
    assert browser.find_elements(By.CSS_SELECTOR, "#compare-replies button[data-pick]") == []
    assert not browser.find_element(By.ID, "compare-picks").is_displayed()
    assert browser.find_element(By.ID, "compare-again").is_displayed()
    browser.save_screenshot(str(ARTIFACTS / "compare-picked.png"))

    pairs = requests.get(server.url + "/api/pairs", timeout=10).json()["pairs"]
    assert len(pairs) == 1
    pair = pairs[0]
    assert (pair["source"], pair["outcome"], pair["blind"]) == ("compare", "b", True)
    assert (pair["a"]["checkpoint_id"], pair["b"]["checkpoint_id"]) == \
        (revealed["A"], revealed["B"])  # winner b, loser a
    assert (pair["a"]["text"], pair["b"]["text"]) == (shown["A"], shown["B"])
    assert pair["prompt"] == "Why is the sky blue?" and f"#{pair['pair_id']}" in outcome
    assert console_errors(browser) == []

    # a reload shows the picked comparison again; at phone width nothing overflows
    phone = build_driver(tmp_path / "phone", width=375, height=800)
    try:
        phone.get(browser.current_url)
        wait(phone, lambda d: cards(d, 2))
        assert "Stored 1 pair" in phone.find_element(By.ID, "compare-outcome").text
        wide = phone.execute_script("return document.documentElement.scrollWidth")
        assert wide <= 376, f"/compare is {wide}px wide on a 375px screen"
        phone.save_screenshot(str(ARTIFACTS / "compare-phone.png"))
        assert console_errors(phone) == []
    finally:
        phone.quit()
        shutil.rmtree(tmp_path / "phone", ignore_errors=True)


def test_compare_a_recent_message_with_a_third_checkpoint_not_blind_tie(browser, server,
                                                                       store):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    turn = requests.post(server.url + "/api/chat", json={"message": "The quick brown fox"},
                         timeout=60).json()
    browser.get(server.url + "/compare")
    recent = wait(browser, lambda d: (lambda s: s if len(s.options) == 2 else None)(
        Select(d.find_element(By.ID, "recent-prompts"))))
    recent.select_by_value(str(turn["turn_id"]))
    assert browser.find_element(By.ID, "compare-prompt").get_attribute("value") == \
        "The quick brown fox"
    Select(browser.find_element(By.ID, "compare-checkpoint")).select_by_value("r0002-test")
    browser.find_element(By.ID, "compare-blind").click()  # not blind
    browser.find_element(By.ID, "compare-go").click()
    three = wait(browser, lambda d: cards(d, 3), timeout=120)
    # not blind: the fixed order, each source shown before the pick
    assert [c.get_attribute("data-checkpoint") for c in three] == \
        ["base", "r0001-test", "r0002-test"]
    assert three[2].find_element(By.CSS_SELECTOR, ".compare-source").text == \
        "checkpoint r0002-test"
    browser.find_element(By.ID, "pick-tie").click()
    wait(browser, lambda d: d.find_element(By.ID, "compare-outcome").text.startswith(
        "Stored 3 pairs"))
    pairs = store.list_pairs()
    assert {(p.outcome, p.blind, p.prompt_turn_id) for p in pairs} == \
        {("tie", False, turn["turn_id"])}
    assert console_errors(browser) == []


def test_compare_on_the_bare_base_is_one_line_in_the_page(browser, server, engine, store):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    # serving the bare base: nothing to compare it with. The store says so too, or the
    # daemon's reconcile (every 10 s) would put r0001 back in the middle of the test.
    store.activate_checkpoint(None)
    engine.request_swap(None, None)
    browser.get(server.url + "/compare")
    wait(browser, lambda d: d.find_element(By.ID, "compare-prompt")).send_keys("hi")
    browser.find_element(By.ID, "compare-go").click()
    error = wait(browser, lambda d: (lambda e: e if e.is_displayed() else None)(
        d.find_element(By.ID, "compare-error")))
    assert error.text.startswith("Compare needs a trained checkpoint")
    assert "Traceback" not in error.text and "\n" not in error.text
    assert not browser.find_element(By.ID, "compare-result").is_displayed()
    assert browser.find_element(By.CSS_SELECTOR, "#compare-error a").get_attribute(
        "href").endswith("/training")
    assert store.counts()["pairs"] == 0
    # another checkpoint is something to compare the base with; the one served (the base)
    # has no rating model, so no reply has a predicted score
    Select(browser.find_element(By.ID, "compare-checkpoint")).select_by_value("r0002-test")
    browser.find_element(By.ID, "compare-go").click()
    two = wait(browser, lambda d: cards(d, 2), timeout=120)
    assert not browser.find_element(By.ID, "compare-error").is_displayed()
    assert all(c.find_element(By.CSS_SELECTOR, ".predicted").text.startswith(
        "no rating model yet") for c in two)
    assert [e for e in console_errors(browser) if "/api/compare" not in e] == []


def test_compare_without_a_model_is_one_line_in_the_page(browser, live, store):
    """A server with no model loaded (here: the fake chat, no engine) answers 501."""
    from selenium.webdriver.common.by import By

    browser.get(live.url + "/compare")
    wait(browser, lambda d: d.find_element(By.ID, "compare-prompt")).send_keys("hi")
    browser.find_element(By.ID, "compare-go").click()
    error = wait(browser, lambda d: (lambda e: e if e.is_displayed() else None)(
        d.find_element(By.ID, "compare-error")))
    assert error.text == ("Compare needs a model, and none is loaded in this server: start it "
                          "with `reinf serve`.")
    assert not browser.find_element(By.ID, "compare-result").is_displayed()
    # the console has the failed request, and nothing else (no script error)
    assert [e for e in console_errors(browser) if "/api/compare" not in e] == []


def test_regenerate_pages_back_picks_and_the_next_message_follows_the_pick(browser, server,
                                                                          store, engine):
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "message").is_displayed())
    send(browser, "Hello there")
    wait(browser, lambda d: latest_turn(d).find_elements(By.CSS_SELECTOR, "section.rating"),
         timeout=60)
    first = int(latest_turn(browser).get_attribute("data-turn-id"))
    assert not latest_turn(browser).find_element(By.CSS_SELECTOR, ".alternatives").is_displayed()
    count = lambda d: latest_turn(d).find_element(By.CSS_SELECTOR, ".alt-count").text  # noqa

    browser.find_element(By.ID, "regenerate").click()
    wait(browser, lambda d: count(d) == "2/2" and
         d.find_elements(By.CSS_SELECTOR, "#transcript section.rating"), timeout=60)
    second = int(latest_turn(browser).get_attribute("data-turn-id"))
    assert second != first and len(browser.find_elements(By.CSS_SELECTOR,
                                                         "#transcript > li")) == 1
    assert store.get_turn(second).picked and not store.get_turn(first).picked
    assert "in use" in latest_turn(browser).find_element(By.CSS_SELECTOR, ".alt-state").text

    # page back to the first reply: its text and its own rating panel
    latest_turn(browser).find_element(By.CSS_SELECTOR, ".alt-prev").click()
    wait(browser, lambda d: count(d) == "1/2")
    turn = latest_turn(browser)
    assert int(turn.get_attribute("data-turn-id")) == first
    assert text_of(browser, turn.find_element(By.CSS_SELECTOR, ".msg.bot .text")) == \
        store.get_turn(first).reply
    panel = turn.find_element(By.CSS_SELECTOR, "section.rating")
    assert int(panel.get_attribute("data-turn-id")) == first
    panel.find_element(By.CSS_SELECTOR, "button[data-score='4']").click()
    wait(browser, lambda d: "Saved: 4/5" in panel.text)
    assert store.get_turn(first).rating.score == 4 and store.get_turn(second).rating is None

    # use it: the conversation continues from it, and the preference is a pair
    turn.find_element(By.CSS_SELECTOR, ".alt-pick").click()
    wait(browser, lambda d: "preference saved" in latest_turn(d).find_element(
        By.CSS_SELECTOR, ".alt-state").text)
    assert store.get_turn(first).picked and not store.get_turn(second).picked
    [pair] = store.list_pairs(source="regenerate")
    assert (pair.a_turn_id, pair.b_turn_id, pair.outcome) == (first, second, "a")
    browser.save_screenshot(str(ARTIFACTS / "chat-alternatives.png"))

    send(browser, "What next?")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#transcript > li")) == 2 and
         latest_turn(d).find_elements(By.CSS_SELECTOR, "section.rating"), timeout=60)
    nxt = store.get_turn(int(latest_turn(browser).get_attribute("data-turn-id")))
    picked, other = store.get_turn(first), store.get_turn(second)
    assert nxt.index == picked.index + 1
    history = [("Hello there", picked.reply)] if picked.reply else []
    assert nxt.prompt_ids == engine.build_prompt(history, "What next?",
                                                 system=nxt.system_prompt)
    if picked.reply != other.reply:  # the other reply is not in the context
        assert nxt.prompt_ids != engine.build_prompt([("Hello there", other.reply)],
                                                     "What next?", system=nxt.system_prompt)

    # the earlier message's replies can be paged, no longer picked
    earlier = browser.find_elements(By.CSS_SELECTOR, "#transcript > li")[0]
    earlier.find_element(By.CSS_SELECTOR, ".alt-next").click()
    wait(browser, lambda d: earlier.find_element(By.CSS_SELECTOR, ".alt-count").text == "2/2")
    use = earlier.find_element(By.CSS_SELECTOR, ".alt-pick")
    assert use.is_displayed() and not use.is_enabled()
    assert console_errors(browser) == []
