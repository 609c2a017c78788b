"""What it learned, on the training page, in a real headless Chromium: each round's win rate
against the base, by the rating model (the run's ``metrics.vs_base.by_rating_model``) and by
the person's picks (their pairs between that checkpoint and the base, GET /api/stats
``picks_vs_base``), drawn as two labelled series with a 50% line and a table of the numbers;
and the leaderboard (GET /api/leaderboard), highest Bradley-Terry score first, the active
checkpoint marked. The store is seeded through its real API (runs, checkpoints, pairs); the
server is the real app with the fake chat (tests/webui_fakes.py). Screenshots go to
test-artifacts/.
"""
from __future__ import annotations

import math
import shutil

import pytest
import requests

from test_browser import ARTIFACTS, browser, build_driver, wait  # noqa: F401 - fixtures
from webui_fakes import app, build_daemon, daemon, fake_chat, live  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e

R1, R2, R3, R4 = ("r0001-20261125-101500-aaaa", "r0002-20261125-103000-bbbb",
                  "r0003-20261125-104500-cccc", "r0004-20261125-110000-dddd")


def model_record(wins: int, ties: int, losses: int) -> dict:
    """A round's ``vs_base.by_rating_model``: one pair per prompt."""
    pairs = wins + ties + losses
    return {"win_rate": (wins + ties / 2) / pairs, "wins": wins, "ties": ties,
            "losses": losses, "pairs": pairs, "prompts": pairs, "score_mean": 3.9,
            "base_score_mean": 3.1, "seconds": 0.8}


def round_(store, tmp_path, checkpoint_id: str, parent_id: str | None, by_model: dict | None,
           *, rejected: bool = False) -> None:
    """One finished round as the trainer records it: promoted (made active) or rejected."""
    path = tmp_path / checkpoint_id
    path.mkdir()
    metrics = {"reward_mean": 0.1, "kl": 0.02,
               "vs_base": {"by_rating_model": by_model, "by_your_picks": None}}
    run = store.start_run("schedule")
    if rejected:
        store.add_checkpoint(checkpoint_id, str(path), parent_id=parent_id, run_id=run.id,
                             metrics=metrics, status="rejected")
        store.finish_run(run.id, "rejected", metrics=metrics, samples=8,
                         error="KL 0.31 > kl_max 0.25", checkpoint_id=checkpoint_id)
    else:
        store.promote(run.id, checkpoint_id, str(path), parent_id=parent_id, metrics=metrics,
                      samples=8)


def pick(store, a: str | None, b: str | None, outcome: str) -> None:
    """A blind compare pair: side a's checkpoint against side b's (None: the base)."""
    store.add_pair("q", outcome, a_text="x", b_text="y", a_checkpoint_id=a, b_checkpoint_id=b,
                   blind=True, prompt_ids=[1], a_reply_ids=[2], b_reply_ids=[3])


def seed(store, tmp_path) -> None:
    """Four rounds: r0001 a cold start (no rating model), r0002 and r0004 promoted, r0003
    rejected; a failed round without a checkpoint. Picks against the base for r0001 (1-1),
    r0002 (3-1) and r0004 (2 and a tie), and r0004 beat r0002 twice."""
    round_(store, tmp_path, R1, None, None)
    round_(store, tmp_path, R2, R1, model_record(10, 2, 4))          # 69%
    round_(store, tmp_path, R3, R2, model_record(4, 0, 12), rejected=True)  # 25%
    failed = store.start_run("manual")
    store.finish_run(failed.id, "failed", error="out of memory")
    round_(store, tmp_path, R4, R2, model_record(12, 2, 2))          # 81%
    pick(store, R1, None, "a")
    pick(store, None, R1, "a")
    for outcome in ("a", "a", "b", "a"):
        pick(store, R2, None, outcome)
    pick(store, None, R4, "b")
    pick(store, R4, None, "a")
    pick(store, R4, None, "tie")
    pick(store, R4, R2, "a")
    pick(store, R2, R4, "b")


def markers(driver, series: str) -> list[tuple[str, int, bool]]:
    """(round label, percent, hollow) of each marker of a series, left to right."""
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f"#winrate-chart [data-series='{series}']")
    return [(m.get_attribute("data-slot"), int(m.get_attribute("data-percent")),
             "hollow" in m.get_attribute("class")) for m in found]


def drawn_percent(driver, series: str) -> list[float]:
    """Where each marker of a series is drawn, read back as a percentage from the y axis
    (the 0% and 100% grid lines): the picture, not just its data attributes."""
    return driver.execute_script("""
        const svg = document.querySelector('#winrate-chart svg');
        const grid = [...svg.querySelectorAll('line.grid')].map((l) => +l.getAttribute('y1'));
        const y0 = Math.max(...grid), y100 = Math.min(...grid);
        return [...svg.querySelectorAll(`[data-series='${arguments[0]}']`)].map((m) => {
          const box = m.getBBox();
          return 100 * (y0 - (box.y + box.height / 2)) / (y0 - y100);
        });""", series)


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and "favicon" not in e["message"]]


def test_win_rate_by_the_rating_model_and_by_your_picks_and_the_leaderboard(
        browser, live, store, tmp_path):
    from selenium.webdriver.common.by import By

    from reinf.training.leaderboard import build_leaderboard

    seed(store, tmp_path)
    # each checkpoint's own picks against the base, as the page reads them
    stats = requests.get(live.url + "/api/stats", timeout=10).json()
    assert {p["checkpoint_id"]: (p["wins"], p["ties"], p["losses"])
            for p in stats["picks_vs_base"]} == {R1: (1, 0, 1), R2: (3, 0, 1), R4: (2, 1, 0)}
    browser.get(live.url + "/training")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#winrate-chart svg"))

    # the two series, labelled, each marker at its round with its value
    legend = browser.find_element(By.ID, "winrate-legend")
    model = legend.find_element(By.CSS_SELECTOR, "li[data-series='model']").text
    picks = legend.find_element(By.CSS_SELECTOR, "li[data-series='picks']").text
    assert model.startswith("Rating model:") and "your 16 newest prompts" in model
    assert picks.startswith("Your picks:") and "between that checkpoint and the base" in picks
    assert "(9 picks)" in picks  # against the base: 2 + 4 + 3
    assert "rejected round" in legend.find_element(
        By.CSS_SELECTOR, "li[data-series='rejected']").text
    # rounds with something measured, oldest first (the failed round has no checkpoint)
    assert markers(browser, "model") == [("r0002", 69, False), ("r0003", 25, True),
                                         ("r0004", 81, False)]
    assert markers(browser, "picks") == [("r0001", 50, False), ("r0002", 75, False),
                                         ("r0004", 83, False)]
    assert drawn_percent(browser, "model") == pytest.approx([68.75, 25, 81.25], abs=0.6)
    assert drawn_percent(browser, "picks") == pytest.approx([50, 75, 100 * 2.5 / 3], abs=0.6)
    labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#winrate-chart text")]
    assert labels[:5] == ["0%", "25%", "50%", "75%", "100%"]
    assert {"r0001", "r0002", "r0003", "r0004", "as good as the base"} <= set(labels)
    # the rating model's rounds are a line; the picks are markers only
    assert len(browser.find_elements(By.CSS_SELECTOR, "#winrate-chart polyline.model")) == 1
    assert browser.find_elements(By.CSS_SELECTOR, "#winrate-chart polyline.picks") == []
    assert len(browser.find_elements(By.CSS_SELECTOR, "#winrate-chart line.reference")) == 1

    # the text alternative: newest round first, the numbers behind each marker
    browser.find_element(By.CSS_SELECTOR, "#winrate-box details summary").click()
    rows = browser.find_elements(By.CSS_SELECTOR, "#winrate-rows tr")
    assert [r.get_attribute("data-checkpoint") for r in rows] == [R4, R3, R2, R1]
    cells = {r.get_attribute("data-checkpoint"): (
        r.find_element(By.CSS_SELECTOR, "td[data-series='model']").text,
        r.find_element(By.CSS_SELECTOR, "td[data-series='picks']").text) for r in rows}
    assert cells[R4] == ("81% · 12 won · 2 tied · 2 lost on 16 prompts",
                         "83% · 2 won · 1 tied · 0 lost")
    assert cells[R3] == ("25% · 4 won · 0 tied · 12 lost on 16 prompts", "–")
    assert cells[R1] == ("–", "50% · 1 won · 0 tied · 1 lost")
    assert "(rejected)" in rows[1].text

    # the leaderboard: highest score first, as the API scores them, the active one marked
    board = build_leaderboard(store)["leaderboard"]
    expected = sorted(board, key=lambda r: -r["score"])
    rows = browser.find_elements(By.CSS_SELECTOR, "#leaderboard-rows tr")
    assert [r.get_attribute("data-checkpoint") for r in rows] == \
        [r["checkpoint_id"] for r in expected]
    assert rows[0].get_attribute("data-checkpoint") == R4
    scores = [float(r.find_element(By.CSS_SELECTOR, "td[data-label='Score']").text)
              for r in rows]
    assert scores == pytest.approx([r["score"] for r in expected], abs=0.006)
    assert scores == sorted(scores, reverse=True)
    active = [r for r in rows if "active" in r.get_attribute("class").split()]
    assert [r.get_attribute("data-checkpoint") for r in active] == [R4]
    assert "(active)" in active[0].text and sum("(active)" in r.text for r in rows) == 1
    top = rows[0]
    r4 = expected[0]
    assert top.find_element(By.CSS_SELECTOR, "td[data-label='vs base']").text == \
        f"{round(100 / (1 + math.exp(-r4['score'])))}%"
    assert top.find_element(By.CSS_SELECTOR, "td[data-label='Picks']").text == \
        str(r4["pairs"]) == "5"
    note = browser.find_element(By.ID, "leaderboard-note").text
    assert "Bradley–Terry" in note and "11 picks between checkpoints" in note
    ARTIFACTS.mkdir(exist_ok=True)
    browser.execute_script("document.getElementById('winrate-box').scrollIntoView()")
    browser.save_screenshot(str(ARTIFACTS / "training-learned.png"))

    # the page's refresh (here: after a rollback) brings a new round, new picks and the new
    # active checkpoint
    round_(store, tmp_path, "r0005-20261125-113000-eeee", R4, model_record(3, 0, 13))
    pick(store, None, "r0005-20261125-113000-eeee", "a")
    browser.find_element(By.XPATH, "//button[text()='Use base model']").click()
    wait(browser, lambda d: d.switch_to.alert).accept()
    wait(browser, lambda d: markers(d, "model")[-1] == ("r0005", 19, False))
    assert markers(browser, "picks")[-1] == ("r0005", 0, False)
    active = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR,
                                                    "#leaderboard-rows tr.active"))
    assert active.get_attribute("data-checkpoint") == "base" and "(active)" in active.text
    assert console_errors(browser) == []


def test_no_rounds_and_no_picks_say_so(browser, live, store):
    from selenium.webdriver.common.by import By

    browser.get(live.url + "/training")
    empty = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR,
                                                   "#winrate-chart .chart-empty"))
    assert empty.text.startswith("No training rounds yet")
    assert not browser.find_element(By.ID, "winrate-legend").is_displayed()
    row = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#leaderboard-rows td"))
    assert row.text == ("No picks between checkpoints yet: pick between replies on the "
                        "Compare page or with regenerate to rank checkpoints.")
    assert browser.find_element(By.ID, "leaderboard-note").text == ""
    assert console_errors(browser) == []


def test_one_round_is_one_marker_and_a_round_without_a_rating_model_is_explained(
        browser, live, store, tmp_path):
    from selenium.webdriver.common.by import By

    round_(store, tmp_path, R1, None, None)  # a cold start: nothing measured
    browser.get(live.url + "/training")
    empty = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR,
                                                   "#winrate-chart .chart-empty"))
    assert empty.text.startswith("No win rate yet: rounds with a rating model measure it")
    round_(store, tmp_path, R2, R1, model_record(9, 1, 6))
    browser.refresh()
    wait(browser, lambda d: markers(d, "model") == [("r0002", 59, False)])
    assert markers(browser, "picks") == []
    assert browser.find_elements(By.CSS_SELECTOR, "#winrate-chart polyline") == []
    assert "none yet" in browser.find_element(
        By.CSS_SELECTOR, "#winrate-legend li[data-series='picks']").text
    assert not browser.find_elements(By.CSS_SELECTOR, "#winrate-legend li[data-series='rejected']")
    # the active checkpoint has no picks: the leaderboard says so once there are any
    pick(store, R1, None, "a")
    browser.refresh()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#leaderboard-rows tr")) == 2)
    assert "The active checkpoint (r0002) has no picks yet." in \
        browser.find_element(By.ID, "leaderboard-note").text
    assert browser.find_elements(By.CSS_SELECTOR, "#leaderboard-rows tr.active") == []
    assert console_errors(browser) == []


def test_phone_width(live, store, tmp_path):
    """At 375 px the chart, its legend and the leaderboard fit the screen."""
    seed(store, tmp_path)
    driver = build_driver(tmp_path / "phone", width=375, height=800)
    try:
        driver.get(live.url + "/training")
        wait(driver, lambda d: markers(d, "model"))
        wide = driver.execute_script("return document.documentElement.scrollWidth")
        assert wide <= 376, f"/training is {wide}px wide on a 375px screen"
        driver.execute_script("document.getElementById('winrate-box').scrollIntoView()")
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "training-learned-phone.png"))
        assert console_errors(driver) == []
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "phone", ignore_errors=True)
