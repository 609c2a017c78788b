"""The web UI in a real headless Chromium (Debian's chromium + chromium-driver, Selenium).

Open the chat, send a message and watch tokens arrive, rate it 4 with a tag, reload the
history page and find the rating, and check that an XSS payload in a prompt and in a
reply stays inert text. Screenshots go to test-artifacts/.

The chat service is FakeChatService: its reply echoes the prompt, so the model's output
carries the payload too. Without Chromium the test fails, unless REINF_SKIP_BROWSER=1.
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from webui_fakes import app, build_daemon, daemon, fake_chat, live  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("REINF_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("REINF_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def build_driver(user_data_dir: Path, width: int = 1280, height: int = 900):
    """A headless Chromium driven by Selenium, or a failure that says what to install."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        if os.environ.get("REINF_SKIP_BROWSER") == "1":
            pytest.skip("REINF_SKIP_BROWSER=1 and no Chromium installed")
        pytest.fail(f"the browser test needs {CHROMIUM} and {CHROMEDRIVER}: "
                    "apt-get install -y chromium chromium-driver (or set REINF_SKIP_BROWSER=1)")
    from reinf.bench.screenshots import build_driver as start_chromium

    return start_chromium(user_data_dir, width=width, height=height, chromium=CHROMIUM,
                          chromedriver=CHROMEDRIVER)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = build_driver(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


def wait(driver, condition, timeout=15):
    """Poll ``condition`` until truthy; elements re-rendered meanwhile are looked up again."""
    from selenium.common.exceptions import (NoAlertPresentException, NoSuchElementException,
                                            StaleElementReferenceException)
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException, NoAlertPresentException,
        IndexError)).until(condition)


def latest_turn(driver):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#transcript > li.turn")[-1]


def send(driver, text):
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "message")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def reply_text(driver):
    from selenium.webdriver.common.by import By

    return latest_turn(driver).find_element(By.CSS_SELECTOR, ".msg.bot .text").text


def test_chat_stream_rate_history_and_xss(browser, live, fake_chat, store):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(exist_ok=True)
    browser.get(live.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "message").is_displayed())

    # 1. tokens arrive while the reply is being generated
    fake_chat.gate = threading.Event()
    send(browser, "hello browser world")
    wait(browser, lambda d: reply_text(d).startswith("echo:"))
    assert not fake_chat.finished  # generation is held at the gate: this came streaming
    assert browser.find_element(By.ID, "stop").is_displayed()
    fake_chat.gate.set()
    wait(browser, lambda d: reply_text(d) == "echo: hello browser world")
    panel = wait(browser, lambda d: latest_turn(d).find_element(By.CSS_SELECTOR, "section.rating"))
    turn_id = int(latest_turn(browser).get_attribute("data-turn-id"))
    assert store.get_turn(turn_id).reply == "echo: hello browser world"

    # 2. rate it 4 with the keyboard shortcut, then add a suggested tag
    ActionChains(browser).send_keys("4").perform()
    wait(browser, lambda d: "Saved: 4/5" in panel.text)
    panel.find_element(By.XPATH, ".//button[@class='tag' and text()='needs examples']").click()
    wait(browser, lambda d: "Saved: 4/5 · needs examples" in panel.text)
    rating = store.get_turn(turn_id).rating
    assert (rating.score, rating.tags) == (4, ["needs examples"])
    assert browser.find_element(By.ID, "message").get_attribute("value") == ""
    browser.save_screenshot(str(ARTIFACTS / "chat.png"))

    # 3. the history page shows the rating, also after a reload
    browser.get(live.url + "/history")
    row_css = f"#history-rows tr[data-turn-id='{turn_id}']"
    row = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, row_css))
    browser.refresh()
    row = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, row_css))
    assert "4/5" in row.text and "needs examples" in row.text
    browser.save_screenshot(str(ARTIFACTS / "history.png"))

    # 4. an XSS payload in the prompt (and so in the echoed reply) stays text
    browser.get(live.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "message").is_displayed())
    send(browser, XSS)
    wait(browser, lambda d: reply_text(d) == "echo: " + XSS)
    turn = latest_turn(browser)
    assert turn.find_element(By.CSS_SELECTOR, ".msg.user .text").text == XSS
    assert turn.find_elements(By.CSS_SELECTOR, "img, script") == []
    assert browser.execute_script("return window.__xss") is None
    browser.get(live.url + "/history")
    wait(browser, lambda d: XSS in d.find_element(By.ID, "history-rows").text)
    assert browser.find_elements(By.CSS_SELECTOR, "#history-rows img, #history-rows script") == []
    assert browser.execute_script("return window.__xss") is None
    # the conversation list shows the payload as a title, as text too
    browser.get(live.url + "/")
    wait(browser, lambda d: XSS[:20] in d.find_element(By.ID, "conversation-list").text)
    assert browser.find_elements(By.CSS_SELECTOR, "#conversation-list img") == []
    assert browser.execute_script("return window.__xss") is None
    # no script error and no Content-Security-Policy violation on any page
    for path in ("/", "/compare", "/history", "/training"):
        browser.get(live.url + path)
        wait(browser, lambda d: d.execute_script("return document.readyState") == "complete")
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"
              and "favicon" not in e["message"]]
    assert errors == []


def test_a_message_starting_with_a_digit_is_text_not_a_rating(browser, live, store):
    """After an unrated reply, "3 plus 4?" typed into the empty message box is sent whole
    and rates nothing; outside a text field the 1-5 keys still rate the latest reply."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(live.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "message").is_displayed())
    send(browser, "first question")
    wait(browser, lambda d: reply_text(d) == "echo: first question")
    first = int(latest_turn(browser).get_attribute("data-turn-id"))
    box = browser.find_element(By.ID, "message")
    box.click()
    box.send_keys("3 plus 4?")
    assert box.get_attribute("value") == "3 plus 4?"
    box.send_keys(Keys.ENTER)
    wait(browser, lambda d: reply_text(d) == "echo: 3 plus 4?")
    second = int(latest_turn(browser).get_attribute("data-turn-id"))
    assert store.get_turn(second).user_message == "3 plus 4?"
    assert store.get_turn(first).rating is None
    panel = latest_turn(browser).find_element(By.CSS_SELECTOR, "section.rating")
    assert "Saved" not in panel.text
    # a digit typed into the system prompt or a tag field is text too
    browser.find_element(By.ID, "new-conversation").click()
    system = wait(browser, lambda d: d.find_element(By.ID, "system-prompt"))
    system.send_keys("5 words at most")
    assert system.get_attribute("value") == "5 words at most"
    browser.get(f"{live.url}/?conversation={store.get_turn(second).conversation_id}")
    panel = wait(browser, lambda d: d.find_element(
        By.CSS_SELECTOR, f"section.rating[data-turn-id='{second}']"))
    # focus outside any text field: the shortcut rates the latest reply
    browser.find_element(By.ID, "transcript").click()
    browser.execute_script("document.activeElement.blur()")
    ActionChains(browser).send_keys("2").perform()
    wait(browser, lambda d: "Saved: 2/5" in panel.text)
    assert store.get_turn(second).rating.score == 2 and store.get_turn(first).rating is None


def test_stop_and_reopen_a_conversation(browser, live, fake_chat, store):
    from selenium.webdriver.common.by import By

    browser.get(live.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "message").is_displayed())
    fake_chat.gate = threading.Event()
    send(browser, "a long answer please")
    wait(browser, lambda d: reply_text(d).startswith("echo:"))
    browser.find_element(By.ID, "stop").click()
    wait(browser, lambda d: "stopped" in latest_turn(d).find_element(By.CSS_SELECTOR, ".meta").text)
    turn_id = int(latest_turn(browser).get_attribute("data-turn-id"))
    assert store.get_turn(turn_id).interrupted
    conversation_id = store.get_turn(turn_id).conversation_id
    # regenerate gives another reply to the same message, in the same place
    fake_chat.gate = None
    browser.find_element(By.ID, "regenerate").click()
    wait(browser, lambda d: reply_text(d) == "echo #2: a long answer please")
    wait(browser, lambda d: latest_turn(d).find_element(By.CSS_SELECTOR, ".alt-count").text
         == "2/2")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#transcript > li")) == 1
    [again] = store.conversation_turns(conversation_id)  # the path: the new reply in use
    assert again.id != turn_id and len(store.alternatives(turn_id)) == 2
    # a new conversation, then reopen the old one from the list: one message, two replies
    browser.find_element(By.ID, "new-conversation").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#transcript > li") == [])
    item = wait(browser, lambda d: d.find_element(
        By.CSS_SELECTOR, f"button.conversation[data-conversation-id='{conversation_id}']"))
    item.click()
    wait(browser, lambda d: latest_turn(d).find_element(By.CSS_SELECTOR, ".alt-count").text
         == "2/2")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#transcript > li")) == 1
    assert reply_text(browser) == "echo #2: a long answer please"


def test_a_reply_asked_for_in_a_style_says_so_under_it(browser, live, fake_chat, store):
    from selenium.webdriver.common.by import By

    browser.get(live.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "message").is_displayed())
    send(browser, "plain please")
    wait(browser, lambda d: reply_text(d) == "echo: plain please")
    assert "style" not in latest_turn(browser).find_element(By.CSS_SELECTOR, ".meta").text
    fake_chat.style = "Use a bulleted list."
    send(browser, "explore please")
    wait(browser, lambda d: "asked for in a style: Use a bulleted list." in
         latest_turn(d).find_element(By.CSS_SELECTOR, ".meta").text)
    conversation_id = store.last_turn().conversation_id
    browser.get(f"{live.url}/?conversation={conversation_id}")  # reopened from the store
    wait(browser, lambda d: "asked for in a style: Use a bulleted list." in
         latest_turn(d).find_element(By.CSS_SELECTOR, ".meta").text)


def test_phone_width_layout(live, fake_chat, store, tmp_path):
    """At 375 px nothing overflows sideways and the composer and rating still work."""
    from selenium.webdriver.common.by import By

    tid = store.append_turn(store.create_conversation().id, "a question", "an answer").id
    store.rate(tid, 3, tags=["too long"])
    driver = build_driver(tmp_path / "phone", width=375, height=740)
    try:
        for path in ("/", "/compare", "/history", "/training"):
            driver.get(live.url + path)
            wait(driver, lambda d: d.execute_script("return document.readyState") == "complete")
            wide = driver.execute_script("return document.documentElement.scrollWidth")
            assert wide <= 376, f"{path} is {wide}px wide on a 375px screen"
        driver.get(live.url + "/")
        # the top bar is one line, and the composer's buttons are in view, not under the fold
        bar = driver.find_element(By.CSS_SELECTOR, ".topbar").rect
        assert bar["height"] < 56, f"the top bar wraps: {bar['height']}px high"
        bottom = driver.execute_script(
            "return document.getElementById('send').getBoundingClientRect().bottom")
        assert bottom <= 740, f"Send is at {bottom}px on a 740px screen"
        send(driver, "from a phone")
        panel = wait(driver, lambda d: latest_turn(d).find_element(By.CSS_SELECTOR,
                                                                   "section.rating"))
        panel.find_element(By.CSS_SELECTOR, "button[data-score='5']").click()
        wait(driver, lambda d: "Saved: 5/5" in panel.text)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "chat-phone.png"))
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "phone", ignore_errors=True)


def test_history_filters_and_forget(browser, live, store):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    conv = store.create_conversation().id
    keep = store.append_turn(conv, "keep me", "kept reply").id
    drop = store.append_turn(conv, "drop me", "dropped reply").id
    store.rate(keep, 5, tags=["great tone"])
    store.rate(drop, 2, tags=["wrong"])
    browser.get(live.url + "/history")
    rows = "#history-rows tr"
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 2)
    Select(browser.find_element(By.ID, "filter-rating")).select_by_value("4-5")
    browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
    wait(browser, lambda d: [r.get_attribute("data-turn-id") for r in
                             d.find_elements(By.CSS_SELECTOR, rows)] == [str(keep)])
    assert "min_score=4" in browser.current_url
    browser.find_element(By.CSS_SELECTOR, "#filters button[type=reset]").click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 2)
    tag = browser.find_element(By.ID, "filter-tag")
    tag.send_keys("wrong")
    browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
    row = wait(browser, lambda d: (lambda r: r[0] if len(r) == 1 and
                                   r[0].get_attribute("data-turn-id") == str(drop) else None)(
        d.find_elements(By.CSS_SELECTOR, rows)))
    row.find_element(By.XPATH, ".//button[text()='Delete turn']").click()
    wait(browser, lambda d: d.switch_to.alert).accept()
    wait(browser, lambda d: "No turns match" in d.find_element(By.ID, "history-count").text)
    assert [t.id for t in store.history(limit=None)] == [keep]


def test_training_page_shows_runs_hook_error_and_rolls_back(browser, config, store, tmp_path,
                                                           fake_chat, build_daemon):
    from selenium.webdriver.common.by import By

    from webui import create_app
    from webui.server import BackgroundServer

    hook = config.data_dir / "mapper.py"
    hook.write_text("def reward_mapper(score, metadata):\n    return undefined_name\n")
    cfg = config.replace(reward_mapper=f"{hook}:reward_mapper")
    for score, ckpt in ((2, None), (3, None), (4, "ckpt-2"), (5, "ckpt-2")):
        tid = store.append_turn(store.create_conversation().id, "q", "a", checkpoint_id=ckpt).id
        store.rate(tid, score)  # rated before the runs: nothing is waiting afterwards
    from reinf.training.checkpoints import REQUIRED

    for n, reward in ((1, 0.1), (2, 0.45)):
        (tmp_path / f"c{n}").mkdir()  # complete on disk: the daemon keeps it active
        for file in REQUIRED:
            (tmp_path / f"c{n}" / file).write_text("x")
        run = store.start_run("manual")
        store.add_checkpoint(f"ckpt-{n}", str(tmp_path / f"c{n}"), run_id=run.id,
                             parent_id=f"ckpt-{n - 1}" if n > 1 else None,
                             metrics={"reward_mean": reward, "kl": 0.01})
        store.finish_run(run.id, "succeeded", samples=4, checkpoint_id=f"ckpt-{n}",
                         metrics={"reward_mean": reward, "kl": 0.01, "clipfrac": 0.1})
    store.activate_checkpoint("ckpt-2")
    app = create_app(cfg, store=store, chat=fake_chat, daemon=build_daemon(config=cfg))
    with BackgroundServer(app) as server:
        browser.get(server.url + "/training")
        wait(browser, lambda d: d.find_element(By.ID, "active-checkpoint").text == "ckpt-2")
        assert browser.find_element(By.ID, "hook-state").text == "broken"
        # build_daemon schedules nothing, as `reinf serve --no-train`: say so, promise no run
        assert browser.find_element(By.ID, "next-run").text == \
            "scheduled training is off (--no-train): use Train now"
        assert "undefined_name" in browser.find_element(By.ID, "hook-error").text
        assert len(browser.find_elements(By.CSS_SELECTOR, "#run-rows tr")) == 2
        assert len(browser.find_elements(By.CSS_SELECTOR, "#reward-chart circle.dot")) == 2
        bars = browser.find_elements(By.CSS_SELECTOR, "#rating-chart rect.bar")
        assert len(bars) == 2  # base (mean 2.5) and ckpt-2 (mean 4.5)
        assert "4.50" in browser.find_element(By.ID, "rating-chart").text
        browser.save_screenshot(str(ARTIFACTS / "training.png"))
        browser.find_element(By.XPATH, "//button[text()='Use base model']").click()
        wait(browser, lambda d: d.switch_to.alert).accept()
        wait(browser, lambda d: d.find_element(By.ID, "active-checkpoint").text == "base")
        assert store.active_checkpoint() is None
        nothing = browser.find_element(By.ID, "train-now")
        nothing.click()  # no new ratings since the last run
        toast = wait(browser, lambda d: d.find_element(By.ID, "toast"))
        wait(browser, lambda d: "nothing new to train on" in toast.text)


def test_rating_panel_comment_critical_undo_and_rerate(browser, live, store):
    from selenium.webdriver.common.by import By

    conv = store.create_conversation().id
    tid = store.append_turn(conv, "explain", "a reply").id
    browser.get(f"{live.url}/?conversation={conv}")
    panel = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR,
                                                   f"section.rating[data-turn-id='{tid}']"))
    panel.find_element(By.CSS_SELECTOR, "button[data-score='2']").click()
    wait(browser, lambda d: "Saved: 2/5" in panel.text)
    panel.find_element(By.TAG_NAME, "summary").click()
    panel.find_element(By.CSS_SELECTOR, "input.free-tag-input").send_keys("rambles\n")
    panel.find_element(By.TAG_NAME, "textarea").send_keys("too wordy")
    panel.find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()  # blur saves the comment
    wait(browser, lambda d: "Saved: 2/5 · rambles · critical · commented" in panel.text)
    rating = store.get_turn(tid).rating
    assert (rating.score, rating.tags, rating.comment, rating.critical) == (
        2, ["rambles"], "too wordy", True)
    panel.find_element(By.XPATH, ".//button[text()='Undo']").click()
    wait(browser, lambda d: "Rating removed" in panel.text)
    assert store.get_turn(tid).rating is None
    panel.find_element(By.CSS_SELECTOR, "button[data-score='5']").click()
    wait(browser, lambda d: "Saved: 5/5" in panel.text)
    assert store.get_turn(tid).rating.score == 5
    browser.refresh()  # the saved state comes back from the server
    panel = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR,
                                                   f"section.rating[data-turn-id='{tid}']"))
    wait(browser, lambda d: "Saved: 5/5 · rambles" in panel.text)


def test_rating_a_deleted_turn_says_so_and_chooses_no_score(browser, live, store):
    """The turn was forgotten (say, in another tab) after the page showed it: the panel
    said "Not saved: no turn N — see `reinf history` for turn ids", a command-line hint,
    and left the clicked score highlighted as if chosen."""
    from selenium.webdriver.common.by import By

    conv = store.create_conversation().id
    tid = store.append_turn(conv, "explain", "a reply").id
    browser.get(f"{live.url}/?conversation={conv}")
    panel = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR,
                                                   f"section.rating[data-turn-id='{tid}']"))
    store.forget_turn(tid)
    panel.find_element(By.CSS_SELECTOR, "button[data-score='4']").click()
    wait(browser, lambda d: "Not saved: this reply was deleted" in panel.text)
    assert "reinf" not in panel.text and "`" not in panel.text
    buttons = panel.find_elements(By.CSS_SELECTOR, "button.score")
    assert [b.get_attribute("aria-pressed") for b in buttons] == ["false"] * 5
    assert all(not b.is_enabled() for b in buttons)


def complete_checkpoint(store, tmp_path, checkpoint_id: str, reward: float,
                        parent_id: str | None = None) -> None:
    """A promoted checkpoint with its files on disk (the daemon only activates loadable ones)
    and the succeeded run that made it."""
    from reinf.training.checkpoints import REQUIRED

    path = tmp_path / checkpoint_id
    path.mkdir()
    for file in REQUIRED:
        (path / file).write_text("x")
    run = store.start_run("manual")
    store.add_checkpoint(checkpoint_id, str(path), run_id=run.id, parent_id=parent_id,
                         metrics={"reward_mean": reward, "kl": 0.01})
    store.finish_run(run.id, "succeeded", samples=4, checkpoint_id=checkpoint_id,
                     metrics={"reward_mean": reward, "kl": 0.01, "clipfrac": 0.1})


def post_json(url: str, body: dict) -> dict:
    """A script's request (not the page's): JSON, no CSRF token needed."""
    import json
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback
    with opener.open(request, timeout=10) as response:
        return json.loads(response.read())


def test_the_header_pill_follows_the_active_checkpoint(browser, config, store, tmp_path,
                                                      fake_chat, build_daemon):
    """A round running in the background, then checkpoints switched behind the page's back
    (as a finished round or `reinf rollback` does): the pill shows the new one, on the chat
    page by itself while the round runs, and on the training page next to the card."""
    from selenium.webdriver.common.by import By

    from webui import create_app
    from webui.server import BackgroundServer
    from webui_fakes import FakeRunner

    complete_checkpoint(store, tmp_path, "ckpt-1", 0.1)
    complete_checkpoint(store, tmp_path, "ckpt-2", 0.2, parent_id="ckpt-1")
    store.activate_checkpoint("ckpt-1")
    runner = FakeRunner()
    runner.gate.clear()  # the round runs until the test lets it end
    app = create_app(config, store=store, chat=fake_chat,
                     daemon=build_daemon(runner=runner))
    pill = lambda d: d.find_element(By.ID, "status-pill").text  # noqa: E731
    try:
        with BackgroundServer(app) as server:
            assert post_json(server.url + "/api/train", {"force": True})["started"]
            browser.get(server.url + "/")
            wait(browser, lambda d: pill(d).endswith(" · ckpt-1"))
            post_json(server.url + "/api/rollback", {"checkpoint_id": "ckpt-2"})
            wait(browser, lambda d: pill(d).endswith(" · ckpt-2"), timeout=20)

            browser.get(server.url + "/training")
            wait(browser, lambda d: d.find_element(By.ID, "training-state").text == "running…")
            post_json(server.url + "/api/rollback", {"checkpoint_id": "base"})
            wait(browser, lambda d: d.find_element(By.ID, "active-checkpoint").text == "base",
                 timeout=20)
            wait(browser, lambda d: pill(d).endswith(" · base"), timeout=5)
            runner.gate.set()
            wait(browser, lambda d: d.find_element(By.ID, "training-state").text == "idle",
                 timeout=20)
            assert pill(browser).endswith(" · base")
    finally:
        runner.gate.set()


def test_the_reward_chart_keeps_the_reward_scale(browser, live, store, tmp_path):
    """Runs whose reward_mean differs by 0.04 are drawn on the reward scale [-1, 1], not
    zoomed until the noise fills the chart."""
    from selenium.webdriver.common.by import By

    complete_checkpoint(store, tmp_path, "ckpt-1", 0.54)
    complete_checkpoint(store, tmp_path, "ckpt-2", 0.50, parent_id="ckpt-1")
    browser.get(live.url + "/training")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#reward-chart circle.dot")) == 2)
    ticks = [t.text for t in browser.find_elements(
        By.CSS_SELECTOR, "#reward-chart text.tick") if t.text and ":" not in t.text]
    assert ticks[:5] == ["-1", "-0.50", "0", "0.50", "1"], ticks
    ys = [float(c.get_attribute("cy"))
          for c in browser.find_elements(By.CSS_SELECTOR, "#reward-chart circle.dot")]
    assert abs(ys[0] - ys[1]) < 10  # 0.04 apart: a few pixels, not the chart's height
    value_range = lambda values: browser.execute_script(  # noqa: E731
        "return Charts.valueRange(arguments[0])", values)
    assert value_range([0.5, 0.54]) == [-1, 1]
    assert value_range([0.3]) == [-1, 1]
    assert value_range([-1.7, 0.2]) == [-2, 1]   # beyond the scale: widened to the next half
    assert value_range([0.9, 1.2]) == [-1, 1.5]


def test_a_system_prompt_is_set_before_the_first_message_then_shown(browser, live, store):
    """A new conversation offers the system prompt box; what is typed there is sent with
    the first message, then the box gives way to the prompt shown read-only, also when the
    conversation is opened again and in the history."""
    from selenium.webdriver.common.by import By

    browser.get(live.url + "/")
    box = wait(browser, lambda d: d.find_element(By.ID, "system-prompt"))
    assert box.is_displayed() and box.get_attribute("value") == ""  # config: none
    assert not browser.find_element(By.ID, "system-shown").is_displayed()
    box.send_keys("Answer like a pirate. " + XSS)
    send(browser, "ahoy")
    wait(browser, lambda d: reply_text(d) == "echo: ahoy")
    [conv] = store.list_conversations()
    assert conv.system_prompt == "Answer like a pirate. " + XSS
    shown = browser.find_element(By.ID, "system-shown")
    wait(browser, lambda d: shown.is_displayed())
    assert not browser.find_element(By.ID, "system-prompt").is_displayed()
    assert browser.find_element(By.ID, "system-text").text == conv.system_prompt
    # opened again: shown, not editable; New conversation: editable and empty again
    browser.get(f"{live.url}/?conversation={conv.id}")
    wait(browser, lambda d: d.find_element(By.ID, "system-text").text == conv.system_prompt)
    assert not browser.find_element(By.ID, "system-prompt").is_displayed()
    browser.find_element(By.ID, "new-conversation").click()
    wait(browser, lambda d: d.find_element(By.ID, "system-prompt").is_displayed())
    assert browser.find_element(By.ID, "system-prompt").get_attribute("value") == ""
    assert not browser.find_element(By.ID, "system-shown").is_displayed()
    # the history shows it beside the message
    browser.get(live.url + "/history")
    row = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#history-rows tr"))
    assert "System: Answer like a pirate." in row.text
    assert browser.execute_script("return window.__xss") is None


def test_sign_in_and_out_with_an_auth_token(browser, config, store, fake_chat, daemon):
    """The server sends Referrer-Policy: no-referrer, so Chromium posts the login form with
    Origin: null; signing in must still work, and signing out must end it."""
    from selenium.webdriver.common.by import By

    from webui import create_app
    from webui.server import BackgroundServer

    token = "s3cret-token-0123456"
    app = create_app(config.replace(auth_token=token), store=store, chat=fake_chat,
                     daemon=daemon)
    with BackgroundServer(app, threads=4) as server:
        browser.delete_all_cookies()
        browser.get(server.url + "/history")
        wait(browser, lambda d: "/login" in d.current_url)
        box = browser.find_element(By.NAME, "token")
        box.send_keys(token)
        box.submit()
        wait(browser, lambda d: "/history" in d.current_url and "/login" not in d.current_url)
        assert "403" not in browser.page_source and "refused" not in browser.page_source
        browser.find_element(By.ID, "logout").click()
        wait(browser, lambda d: "/login" in d.current_url)
        browser.get(server.url + "/history")
        wait(browser, lambda d: "/login" in d.current_url)  # signed out: the cookie is gone
