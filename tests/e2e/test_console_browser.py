"""The console in a real browser (Debian's headless Chromium, driven by Selenium through Debian's chromedriver):
sign in, find the endpoint, open its page, apply a 10x step of load and see the replicas asked for rise and the
autoscaler's decision with its reason appear within 10 s without reloading, then set the split from the page and
read it back with the Databricks SDK. Screenshots of both pages go to the test's folder (the one in the docs,
``docs/how-to/console-endpoint.png``, is such a screenshot)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from databricks.sdk import WorkspaceClient
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from benchmarks.load import LoadResult, run_load
from infra.packages import ensure_chromium
from tests.gateways import LiveGateway, wait_ready
from tests.models import register_row_cost_model
from tests.world import MODEL_NAME, World

pytestmark = pytest.mark.slow

NAME = "console-steps"
PER_ROW_S = 0.025  # one replica serves 40 requests a second
BASE_RPS, STEP_RPS = 4.0, 40.0  # the step: 10x


def _until(check: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:.0f} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    chromium, chromedriver = ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)  # --no-sandbox: the suite may run as root, where Chromium's sandbox cannot
    options.add_argument("--window-size=1500,1100")
    log = tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver, log_output=str(log)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def endpoint(world: World, gateway: LiveGateway) -> str:
    """An endpoint on a model that serves one request at a time (25 ms), so a 10x step needs more replicas."""
    version = register_row_cost_model(world.settings.tracking_uri, "rowcost-console", PER_ROW_S, MODEL_NAME)
    entity = {
        "name": "main",
        "entity_name": "rowcost-console",
        "entity_version": version,
        "max_replicas": 3,
        "autoscaling": {"initial_target": 1, "vertical": False, "shed_load": False},
    }
    with gateway.client(gateway.admin) as api:
        created = api.post("/api/2.0/serving-endpoints", json={"name": NAME, "config": {"served_entities": [entity]}})
        assert created.status_code == 200, created.text
    wait_ready(gateway.url, NAME)
    return NAME


def _cells(browser: WebDriver, table: str) -> list[list[str]]:
    """The table's rows as text, read in one script: the page re-renders its tables on every event."""
    script = (
        "return [...document.querySelectorAll(arguments[0])].slice(1).map(r => [...r.cells].map(c => c.textContent))"
    )
    return browser.execute_script(script, f"#{table} tr")  # type: ignore[no-any-return]


def _open(browser: WebDriver, text: str) -> bool:
    """Click the link ``text``; False while it is not there or was re-rendered under the click."""
    try:
        browser.find_element(By.LINK_TEXT, text).click()
        return True
    except (NoSuchElementException, StaleElementReferenceException):
        return False


def test_sign_in_watch_a_10x_step_scale_out_live_and_set_the_split(gateway, endpoint, browser, tmp_path):
    browser.get(f"{gateway.url}/console/")
    assert browser.current_url.endswith("/console/sign-in")
    browser.find_element(By.NAME, "token").send_keys(gateway.admin)
    browser.find_element(By.CSS_SELECTOR, "form button").click()
    _until(lambda: browser.find_elements(By.LINK_TEXT, endpoint), 30, "the endpoint in the table")
    browser.save_screenshot(str(tmp_path / "console-endpoints.png"))
    _until(lambda: _open(browser, endpoint), 10, "the endpoint's page")
    _until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#charts canvas")) >= 5, 30, "the endpoint's charts")
    _until(lambda: browser.find_element(By.ID, "status").text.startswith("READY, live"), 30, "the live status")
    page = browser.current_url
    before = {tuple(row) for row in _cells(browser, "decisions")}

    body = b'{"dataframe_split": {"columns": ["x"], "data": [[1.0]]}}'
    url = f"{gateway.url}/serving-endpoints/{endpoint}/invocations"
    results: list[LoadResult] = []

    def load() -> None:
        results.append(asyncio.run(run_load(url, gateway.admin, body, 3.0, rate=BASE_RPS)))
        results.append(asyncio.run(run_load(url, gateway.admin, body, 12.0, rate=STEP_RPS)))

    sender = threading.Thread(target=load, daemon=True)
    sender.start()
    _until(lambda: len(results) == 1, 30, "the base load")
    stepped = time.monotonic()

    def scaled_out() -> list[list[str]]:
        new = [row for row in _cells(browser, "decisions") if tuple(row) not in before and int(row[2]) >= 2]
        desired = [row[5] for row in _cells(browser, "entities")]
        return new if new and desired and desired[0] not in ("-", "") and int(desired[0]) >= 2 else []

    decided = _until(scaled_out, 10, "a scale-out decision and the replicas asked for rising on the page")
    seen_s = time.monotonic() - stepped
    assert browser.current_url == page  # no reload, no navigation: the events did it
    assert decided[0][4], "a decision without its reason"  # type: ignore[index]
    print(f"console: a scale-out to {decided[0][2]} replicas shown {seen_s:.1f} s after the 10x step")  # type: ignore[index]
    browser.save_screenshot(str(tmp_path / "console-endpoint.png"))
    sender.join(60)
    assert not sender.is_alive() and all(set(r.statuses()) == {"200"} for r in results), [r.summary() for r in results]

    field = browser.find_element(By.CSS_SELECTOR, "#split input[name=main]")
    field.clear()
    field.send_keys("100")
    browser.find_element(By.CSS_SELECTOR, "#split button").click()
    confirm = _until(lambda: _alert(browser), 10, "the confirmation")
    assert "main 100 %" in confirm.text  # type: ignore[attr-defined]
    confirm.accept()  # type: ignore[attr-defined]
    _until(lambda: browser.find_element(By.ID, "split-status").text.startswith("set:"), 30, "the split's answer")
    wait_ready(gateway.url, endpoint)
    routes = WorkspaceClient(host=gateway.url, token=gateway.admin).serving_endpoints.get(endpoint).config
    assert [(r.served_model_name, r.traffic_percentage) for r in routes.traffic_config.routes] == [("main", 100)]
    assert Path(tmp_path / "console-endpoints.png").stat().st_size > 0


def _alert(browser: WebDriver) -> object:
    try:
        return browser.switch_to.alert
    except Exception:  # NoAlertPresentException: not yet
        return None
