"""The rewrite in a real headless Chromium (Debian's chromium + chromium-driver, Selenium):
the person writes the reply they wanted under a reply in the chat, the API stores exactly
that text, the page shows it after a reload and in the history, and Remove rewrite deletes
it. An empty rewrite shows the API's error in the panel and stores nothing.

The chat service is FakeChatService (its reply echoes the prompt); the browser and its
helpers are test_browser.py's. Without Chromium the tests fail, unless REINF_SKIP_BROWSER=1.
"""
from __future__ import annotations

import pytest
import requests

from test_browser import ARTIFACTS, XSS, browser, latest_turn, reply_text, send, wait  # noqa: F401
from webui_fakes import app, build_daemon, daemon, fake_chat, live  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e

NO_PROXY = {"http": "", "https": ""}  # the server is on loopback


def api_turn(live, turn_id: int) -> dict:
    """GET /api/turns/<id>, as a script would read it."""
    r = requests.get(f"{live.url}/api/turns/{turn_id}", timeout=10, proxies=NO_PROXY)
    assert r.status_code == 200, r.text
    return r.json()


def panel_of(driver, turn_id: int):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f"section.rating[data-turn-id='{turn_id}']")


def value_of(driver, element) -> str:
    """A text field's exact value (Selenium's .text folds whitespace)."""
    return driver.execute_script("return arguments[0].value", element)


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and "favicon" not in e["message"]]


def test_write_a_rewrite_see_it_after_a_reload_and_in_the_history_then_remove_it(
        browser, live, store):
    from selenium.webdriver.common.by import By

    browser.get(live.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "message").is_displayed())
    send(browser, "say something nice")
    wait(browser, lambda d: reply_text(d) == "echo: say something nice")
    turn_id = int(latest_turn(browser).get_attribute("data-turn-id"))
    panel = wait(browser, lambda d: panel_of(d, turn_id))
    mark = panel.find_element(By.CSS_SELECTOR, ".rewrite-mark")
    assert not mark.is_displayed() and "rewritten" not in panel.text

    # Rewrite opens an editor holding the reply, focused
    opener = panel.find_element(By.CSS_SELECTOR, "button.rewrite-open")
    assert opener.get_attribute("aria-expanded") == "false"
    opener.click()
    box = panel.find_element(By.CSS_SELECTOR, ".rewrite-editor textarea")
    wait(browser, lambda d: box.is_displayed())
    assert opener.get_attribute("aria-expanded") == "true"
    assert box.get_attribute("aria-label")
    assert value_of(browser, box) == "echo: say something nice"
    assert browser.switch_to.active_element == box
    wanted = "Something nice, in two lines.\nAnd " + XSS
    box.clear()
    box.send_keys(wanted)
    panel.find_element(By.CSS_SELECTOR, "button[aria-label='Save rewrite']").click()
    wait(browser, lambda d: mark.is_displayed() and "Rewrite saved" in panel.text)
    assert not box.is_displayed()  # the editor closed
    assert api_turn(live, turn_id)["rewrite"]["text"] == wanted
    assert store.get_turn(turn_id).rating is None  # a rewrite is no rating
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "chat-rewrite.png"))

    # after a reload the mark shows, and the editor opens on the saved text
    browser.refresh()
    panel = wait(browser, lambda d: panel_of(d, turn_id))
    wait(browser, lambda d: panel.find_element(By.CSS_SELECTOR, ".rewrite-mark").is_displayed())
    assert "✎ rewritten" in panel.text
    panel.find_element(By.CSS_SELECTOR, "button.rewrite-open").click()
    box = panel.find_element(By.CSS_SELECTOR, ".rewrite-editor textarea")
    wait(browser, lambda d: box.is_displayed())
    assert value_of(browser, box) == wanted
    box.send_keys(" and more")  # Cancel drops what was typed
    panel.find_element(By.CSS_SELECTOR, "button[aria-label='Cancel rewrite']").click()
    wait(browser, lambda d: not box.is_displayed())
    assert api_turn(live, turn_id)["rewrite"]["text"] == wanted
    assert panel.find_elements(By.CSS_SELECTOR, "img, script") == []
    assert browser.execute_script("return window.__xss") is None

    # the history shows the mark, and the text behind it, as text
    browser.get(live.url + "/history")
    row = wait(browser, lambda d: d.find_element(
        By.CSS_SELECTOR, f"#history-rows tr[data-turn-id='{turn_id}']"))
    assert "✎ rewritten" in row.text and "Something nice" not in row.text  # collapsed
    row.find_element(By.CSS_SELECTOR, ".rewrite-block summary").click()
    wait(browser, lambda d: "Something nice, in two lines." in row.text)
    assert row.find_elements(By.CSS_SELECTOR, "img, script") == []
    assert browser.execute_script("return window.__xss") is None

    # Remove rewrite deletes it
    browser.get(f"{live.url}/?conversation={store.get_turn(turn_id).conversation_id}")
    panel = wait(browser, lambda d: panel_of(d, turn_id))
    remove = wait(browser, lambda d: panel.find_element(
        By.CSS_SELECTOR, "button.rewrite-remove"))
    wait(browser, lambda d: remove.is_displayed())
    remove.click()
    wait(browser, lambda d: "Rewrite removed" in panel.text)
    assert not panel.find_element(By.CSS_SELECTOR, ".rewrite-mark").is_displayed()
    assert not remove.is_displayed()
    assert api_turn(live, turn_id)["rewrite"] is None
    assert console_errors(browser) == []


def test_an_empty_rewrite_shows_the_api_error_and_stores_nothing(browser, live, store):
    from selenium.webdriver.common.by import By

    conv = store.create_conversation().id
    tid = store.append_turn(conv, "explain", "a reply").id
    refused = requests.put(f"{live.url}/api/turns/{tid}/rewrite", json={"text": "  \n "},
                           timeout=10, proxies=NO_PROXY)
    assert refused.status_code == 400
    error = refused.json()["error"]
    browser.get(f"{live.url}/?conversation={conv}")
    panel = wait(browser, lambda d: panel_of(d, tid))
    panel.find_element(By.CSS_SELECTOR, "button.rewrite-open").click()
    box = panel.find_element(By.CSS_SELECTOR, ".rewrite-editor textarea")
    wait(browser, lambda d: box.is_displayed())
    assert value_of(browser, box) == "a reply"
    box.clear()
    box.send_keys("  ")
    panel.find_element(By.CSS_SELECTOR, "button[aria-label='Save rewrite']").click()
    state = panel.find_element(By.CSS_SELECTOR, ".rewrite-state")
    wait(browser, lambda d: "Rewrite not saved:" in state.text)
    assert error in state.text
    assert box.is_displayed()  # the editor stays open to fix it
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "chat-rewrite-refused.png"))
    assert not panel.find_element(By.CSS_SELECTOR, ".rewrite-mark").is_displayed()
    assert api_turn(live, tid)["rewrite"] is None
    assert store.get_rewrite(tid) is None


def test_a_low_score_asks_for_a_rewrite_until_one_is_saved(browser, live, store):
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # the shared browser's log: drop what earlier tests left
    conv = store.create_conversation().id
    tid = store.append_turn(conv, "explain", "a reply").id
    browser.get(f"{live.url}/?conversation={conv}")
    panel = wait(browser, lambda d: panel_of(d, tid))
    hint = panel.find_element(By.CSS_SELECTOR, ".rewrite-hint")
    state = panel.find_element(By.CSS_SELECTOR, ".rating-state")

    def rate(n: int) -> None:
        panel.find_element(By.CSS_SELECTOR, f"button.score[data-score='{n}']").click()
        wait(browser, lambda d: f"Saved: {n}/5" in state.text)

    assert not hint.is_displayed()  # unrated
    rate(4)
    assert not hint.is_displayed()
    rate(2)
    wait(browser, lambda d: hint.is_displayed())
    assert "Rewrite the reply to show what you do" in hint.text
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "chat-rewrite-hint.png"))
    opener = panel.find_element(By.CSS_SELECTOR, "button.rewrite-open")
    opener.click()  # the editor open: the line has done its work
    wait(browser, lambda d: not hint.is_displayed())
    panel.find_element(By.CSS_SELECTOR, "button[aria-label='Cancel rewrite']").click()
    wait(browser, lambda d: hint.is_displayed())

    # after a reload it comes from the stored score; a saved rewrite puts it away
    browser.refresh()
    panel = wait(browser, lambda d: panel_of(d, tid))
    hint = panel.find_element(By.CSS_SELECTOR, ".rewrite-hint")
    state = panel.find_element(By.CSS_SELECTOR, ".rating-state")
    wait(browser, lambda d: hint.is_displayed())
    panel.find_element(By.CSS_SELECTOR, "button.rewrite-open").click()
    box = panel.find_element(By.CSS_SELECTOR, ".rewrite-editor textarea")
    wait(browser, lambda d: box.is_displayed())
    box.clear()
    box.send_keys("the reply I wanted")
    panel.find_element(By.CSS_SELECTOR, "button[aria-label='Save rewrite']").click()
    wait(browser, lambda d: "Rewrite saved" in panel.text)
    assert not hint.is_displayed()
    assert store.get_rewrite(tid).text == "the reply I wanted"
    assert store.get_turn(tid).rating.score == 2
    # with the rewrite removed it is back; undoing the score puts it away
    panel.find_element(By.CSS_SELECTOR, "button.rewrite-remove").click()
    wait(browser, lambda d: hint.is_displayed())
    panel.find_element(By.CSS_SELECTOR, "button.undo").click()
    wait(browser, lambda d: "Rating removed" in state.text)
    assert not hint.is_displayed()
    assert console_errors(browser) == []
