"""Screenshots of the chat, compare, history and training pages from a real run on the demo
model.

    python -m reinf.bench.screenshots [--out docs/screenshots] [--model reinf-demo]

It starts the whole server in this process (engine, ChatService, daemon with its
scheduler and child trainer, waitress on a free loopback port) with a fresh data
directory, then drives headless Chromium like a person: chats, rates each reply the way
someone who likes short, plain answers would, lets the scheduler train after
``train_after_ratings`` ratings, chats and rates more, presses "Train now", regenerates
the last reply, compares the base model with the trained checkpoint blind and picks the
reply it likes; then chats and rates more, trains a third round and compares the base, the
active checkpoint and the first one blind a few times, picking each time, so the training
page has something to show for what it learned (each round's win rate against the base by
the rating model and by those picks, and the leaderboard). It saves chat.png, history.png,
training.png, compare.png (before the pick), compare-picked.png (after it), chat-phone.png,
compare-phone.png and training-phone.png (what it learned, on a phone). Needs Debian's
chromium and chromium-driver. Takes a few minutes on a laptop CPU.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--disable-extensions", "--hide-scrollbars")


def build_driver(user_data_dir: Path, *, width: int = 1280, height: int = 860,
                 chromium: str = CHROMIUM, chromedriver: str = CHROMEDRIVER):
    """Headless Chromium under Selenium; below 500 px wide, a phone is emulated (headless
    windows cannot be that narrow)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # JS errors, CSP reports
    for flag in FLAGS + (f"--window-size={max(width, 500)},{height}",
                         f"--user-data-dir={user_data_dir}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(30)
    if width < 500:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": True})
    return driver


def rate_like_a_person(reply: str) -> tuple[int, list[str]]:
    """Someone who likes short, plain answers without a closing question."""
    from reinf.demo.corpus import detect_styles

    styles = detect_styles(reply)
    score = 3 + (1 if styles["length"] == "terse" else -1) + \
        (1 if styles["format"] == "plain" else 0) - (1 if styles["question"] else 0)
    tags = (["too long"] if styles["length"] == "chatty" else []) + \
        (["great tone"] if score >= 5 else [])
    return max(1, min(5, score)), tags


class Person:
    """Drives the pages the way a person would."""

    def __init__(self, driver, url: str):
        self.driver, self.url = driver, url

    def wait(self, condition, timeout: float = 120):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(condition)

    def open(self, path: str) -> None:
        self.driver.get(self.url + path)
        self.wait(lambda d: d.execute_script("return document.readyState") == "complete")

    def chat_and_rate(self, message: str, *, rate: bool = True, comment: bool = False) -> None:
        from selenium.webdriver.common.by import By

        before = len(self.driver.find_elements(By.CSS_SELECTOR, "#transcript > li"))
        box = self.driver.find_element(By.ID, "message")
        box.send_keys(message)
        self.driver.find_element(By.ID, "send").click()
        turn = self.wait(lambda d: (lambda t: t[-1] if len(t) > before and
                                    t[-1].find_elements(By.CSS_SELECTOR, "section.rating")
                                    else None)(d.find_elements(By.CSS_SELECTOR,
                                                               "#transcript > li")))
        if not rate:
            return
        reply = turn.find_element(By.CSS_SELECTOR, ".msg.bot .text").text
        score, tags = rate_like_a_person(reply)
        panel = turn.find_element(By.CSS_SELECTOR, "section.rating")
        panel.find_element(By.CSS_SELECTOR, f"button[data-score='{score}']").click()
        self.wait(lambda d: "Saved" in panel.text)
        for tag in tags:
            panel.find_element(By.XPATH, f".//button[@class='tag' and text()='{tag}']").click()
            self.wait(lambda d: tag in panel.find_element(By.CSS_SELECTOR,
                                                          ".rating-state").text)
        if comment:  # a comment, "critical" for a bad reply, then the details fold again
            summary = panel.find_element(By.TAG_NAME, "summary")
            summary.click()
            panel.find_element(By.TAG_NAME, "textarea").send_keys(
                "short and plain, just right" if score >= 4 else "too wordy: one line is enough")
            if score <= 2:
                panel.find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
                self.wait(lambda d: "critical" in panel.text)
            else:
                summary.click()  # the comment saves when its box loses focus
                self.wait(lambda d: "commented" in panel.text)
            if panel.find_element(By.TAG_NAME, "details").get_attribute("open") is not None:
                summary.click()

    def regenerate(self) -> None:
        """Another reply to the last message: the pager shows 2/2."""
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.ID, "regenerate").click()
        self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#transcript > li")[-1]
                  .find_element(By.CSS_SELECTOR, ".alt-count").text == "2/2" and
                  d.find_element(By.ID, "send").is_enabled())

    def compare(self, prompt: str, checkpoint: str | None = None) -> None:
        """Ask the Compare page for the replies to ``prompt``, blind; ``checkpoint``: a third
        reply, from that checkpoint."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        self.open("/compare")
        if checkpoint:
            choices = self.wait(lambda d: (lambda s: s if checkpoint in [
                o.get_attribute("value") for o in s.options] else None)(
                Select(d.find_element(By.ID, "compare-checkpoint"))))
            choices.select_by_value(checkpoint)
        self.driver.find_element(By.ID, "compare-prompt").send_keys(prompt)
        self.driver.find_element(By.ID, "compare-go").click()
        self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#compare-replies .compare-reply")
                  or d.find_element(By.ID, "compare-error").is_displayed())
        error = self.driver.find_element(By.ID, "compare-error")
        if error.is_displayed():
            raise RuntimeError(f"compare failed: {error.text}")

    def pick_the_better(self) -> None:
        """Pick the reply this person would rate higher (the first of equals)."""
        from selenium.webdriver.common.by import By

        cards = self.driver.find_elements(By.CSS_SELECTOR, "#compare-replies .compare-reply")
        best = max(cards, key=lambda c: rate_like_a_person(
            c.find_element(By.CSS_SELECTOR, ".text").text)[0])
        best.find_element(By.CSS_SELECTOR, "button[data-pick]").click()
        self.wait(lambda d: d.find_element(By.ID, "compare-outcome").text.startswith("Stored"))

    def train_now(self, store, *, runs: int, tries: int = 10) -> None:
        """Press "Train now" until the round starts (right after a round the scheduler
        may still be finishing it and answer 409)."""
        for _ in range(tries):
            self.wait(lambda d: d.find_element("id", "train-now").is_enabled())
            self.driver.find_element("id", "train-now").click()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if len(store.list_runs()) >= runs:
                    return
                time.sleep(0.5)
            self.open("/training")
        raise TimeoutError("the training round did not start")

    def new_conversation(self) -> None:
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.ID, "new-conversation").click()
        self.wait(lambda d: not d.find_elements(By.CSS_SELECTOR, "#transcript > li"))


def wait_for_runs(store, n: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = store.list_runs()
        if len(runs) >= n and all(r.finished_at for r in runs):
            return
        time.sleep(1)
    raise TimeoutError(f"training run {n} did not finish in {timeout:.0f} s")


def take(out: Path, model: str, home: Path) -> list[Path]:
    from reinf.serving.chat import ChatService
    from reinf.config import load_config, render_yaml
    from reinf.catalog import DEMO_MODEL, resolve_model_path
    from reinf.demo.corpus import sample_prompts
    from reinf.daemon.background import Daemon
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store
    from webui import create_app
    from webui.server import BackgroundServer

    environ = {"REINF_HOME": str(home)}
    # The child trainer reads the config file, so the model choice goes into one.
    config_file = home / "config.yaml"
    config_file.write_text(render_yaml(load_config(environ=environ,
                                                   overrides={"model_path": model})))
    config = load_config(config_file, environ=environ)
    if model == DEMO_MODEL and not (Path(resolve_model_path(config)) / "config.json").exists():
        from reinf.demo.build import build_demo_model

        print(f"building the demo model in {resolve_model_path(config)} …", file=sys.stderr)
        build_demo_model(Path(resolve_model_path(config)))
    store = Store.open(config)
    engine = Engine.load(config)
    daemon = Daemon(config, store, engine).start()
    app = create_app(config, store=store, chat=ChatService(engine, store, config),
                     engine=engine, daemon=daemon)
    prompts = sample_prompts(seed=7, n=28)
    out.mkdir(parents=True, exist_ok=True)
    shots = []
    try:
        with BackgroundServer(app, threads=8) as server:
            driver = build_driver(home / "chromium")
            try:
                person = Person(driver, server.url)
                person.open("/")
                needed = config.schedule.train_after_ratings or 8
                for i, prompt in enumerate(prompts[:needed]):  # the scheduler trains after these
                    if i == needed // 2:
                        person.new_conversation()
                    person.chat_and_rate(prompt)
                wait_for_runs(store, 1)
                person.new_conversation()
                for prompt in prompts[needed:needed + 4]:
                    person.chat_and_rate(prompt)
                person.open("/training")
                person.train_now(store, runs=2)
                wait_for_runs(store, 2)
                person.open("/")
                person.chat_and_rate(prompts[needed + 4], comment=True)
                person.chat_and_rate(prompts[needed + 5])
                person.chat_and_rate(prompts[needed + 6], rate=False)
                person.regenerate()
                driver.set_window_size(1280, 1000)
                shots.append(out / "chat.png")
                driver.save_screenshot(str(shots[-1]))
                person.compare(prompts[needed + 8])
                shots.append(out / "compare.png")
                driver.save_screenshot(str(shots[-1]))
                person.pick_the_better()
                shots.append(out / "compare-picked.png")
                driver.save_screenshot(str(shots[-1]))
                picked_url = driver.current_url  # ?c=<id>: the phone reloads it
                person.open("/history")
                person.wait(lambda d: d.find_elements("css selector", "#history-rows tr"))
                shots.append(out / "history.png")
                driver.save_screenshot(str(shots[-1]))
                # What it learned: a third round, then the base, the active checkpoint and
                # the first one compared blind, each time picked as this person would
                person.open("/")
                person.new_conversation()
                for prompt in prompts[needed + 9:needed + 13]:
                    person.chat_and_rate(prompt)
                person.open("/training")
                person.train_now(store, runs=3)
                wait_for_runs(store, 3)
                first = store.list_runs()[-1].checkpoint_id
                for prompt in prompts[needed + 13:needed + 17]:
                    person.compare(prompt, checkpoint=first)
                    person.pick_the_better()
                person.open("/training")
                person.wait(lambda d: d.find_elements(
                    "css selector", "#reward-chart svg, #reward-chart .chart-empty") and
                    d.find_elements("css selector", "#leaderboard-rows tr") and
                    d.find_elements("css selector",
                                    "#winrate-chart svg, #winrate-chart .chart-empty"))
                tall = driver.execute_script("return document.documentElement.scrollHeight")
                driver.set_window_size(1280, tall + 160)  # the window's frame included
                time.sleep(0.5)
                shots.append(out / "training.png")
                driver.save_screenshot(str(shots[-1]))
            finally:
                driver.quit()
            phone = build_driver(home / "chromium-phone", width=375, height=760)
            try:
                Person(phone, server.url).open("/")
                Person(phone, server.url).chat_and_rate(prompts[needed + 7])
                shots.append(out / "chat-phone.png")
                phone.save_screenshot(str(shots[-1]))
                phone.get(picked_url)
                Person(phone, server.url).wait(lambda d: d.find_element(
                    "id", "compare-outcome").text.startswith("Stored"))
                shots.append(out / "compare-phone.png")
                phone.save_screenshot(str(shots[-1]))
                Person(phone, server.url).open("/training")
                Person(phone, server.url).wait(lambda d: d.find_elements(
                    "css selector", "#winrate-chart svg, #winrate-chart .chart-empty") and
                    d.find_elements("css selector", "#leaderboard-rows tr"))
                phone.execute_script(  # what it learned, not the cards above it
                    "document.querySelector('.learned').previousElementSibling"
                    ".scrollIntoView()")
                time.sleep(0.3)
                shots.append(out / "training-phone.png")
                phone.save_screenshot(str(shots[-1]))
            finally:
                phone.quit()
    finally:
        daemon.shutdown()
        store.close()
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reinf.bench.screenshots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/screenshots", help="where the PNGs go")
    parser.add_argument("--model", default="reinf-demo", help="model_path to serve")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="reinf-screenshots-"))
    try:
        for path in take(Path(args.out), args.model, home):
            print(path)
    finally:
        if args.keep:
            print(f"data dir kept: {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
