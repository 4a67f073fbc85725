"""A real browser on a test's Airflow: Debian's headless Chromium, driven by Selenium through Debian's
chromedriver (the same version: `make setup` installs both), logged in through Airflow's own login page as
a user would. Screenshots go to ``$TRAINYARD_SCREENSHOTS`` (default ``var/screenshots``), the test's
artifacts."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("TRAINYARD_SCREENSHOTS", REPO / "var" / "screenshots"))


def _binaries() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail(
            "headless Chromium is not installed: `make setup` installs it (apt-get install chromium chromium-driver)"
        )
    return chromium, driver


class Browser:
    """One Chromium window on ``airflow``'s UI."""

    def __init__(self, driver: Any, airflow: Any) -> None:
        self.driver, self.airflow = driver, airflow

    def open(self, path: str) -> None:
        self.driver.get(self.airflow.url + path)

    def find(self, css: str, seconds: float = 30, usable: bool = False) -> Any:
        """The first element ``css`` selects, once it is there (the UI draws after its API calls); with
        ``usable``, once it can be typed into or clicked (a section's inputs after it has opened)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        located = (By.CSS_SELECTOR, css)
        ready = (
            expected_conditions.element_to_be_clickable if usable else expected_conditions.presence_of_element_located
        )
        return WebDriverWait(self.driver, seconds).until(ready(located))

    def click(self, element: Any) -> None:
        """Click ``element`` even where a notice (a toast) covers it for a few seconds."""
        self.driver.execute_script("arguments[0].click();", element)

    def all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait_for(self, ok: Callable[[], Any], seconds: float, what: str) -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                found = ok()
            except Exception:  # noqa: BLE001 - the page is still drawing: look again
                found = None
            if found:
                return found
            time.sleep(0.5)
        self.screenshot(f"timeout-{what.replace(' ', '-')[:40]}")
        raise AssertionError(f"{what}: not seen within {seconds:.0f} s on {self.driver.current_url}")

    def text(self) -> str:
        """The page's text, a frame's included (the UI shows a plugin page in one)."""
        from selenium.webdriver.common.by import By

        shown = [self.driver.find_element(By.TAG_NAME, "body").text]
        for frame in self.all("iframe"):
            self.driver.switch_to.frame(frame)
            try:
                shown.append(self.driver.find_element(By.TAG_NAME, "body").text)
            finally:
                self.driver.switch_to.default_content()
        return "\n".join(shown)

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path


@contextmanager
def logged_in(airflow: Any, user: str, width: int = 1400, height: int = 1600) -> Iterator[Browser]:
    """A browser logged into ``airflow``'s UI as ``user``, through its login page."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = _binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    browser = Browser(driver, airflow)
    try:
        password = json.loads((airflow.home / "simple_auth_manager_passwords.json.generated").read_text())[user]
        browser.open("/")
        browser.find("input[name=username]").send_keys(user)
        browser.find("input[name=password]").send_keys(password)
        browser.find("button[type=submit]").click()
        browser.wait_for(lambda: "/auth/login" not in driver.current_url, 60, f"{user}'s login")
        yield browser
    finally:
        driver.quit()
