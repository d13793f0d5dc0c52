"""The explorer page in a real browser (Debian's chromium + chromedriver, driven by selenium): what the page shows
under the pointer must be the recorded numbers, to the precision the page states, with no console error.

In CI (CI=true) a missing browser, driver or selenium is a failure, so the test cannot vanish silently; on a
developer machine it is skipped with the reason and the install command.
"""

import os
import re
import shutil
import sys

import pytest
import torch

from vit_einops import ViT
from vit_einops.explore import write_explorer
from vit_einops.inspect import attention_relevance, attention_rollout, record_attention, token_norms

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
INSTALL = "apt-get install -y chromium chromium-driver && pip install 'vit-einops[test]'"
# Headless, and quiet on the network: without the background-networking flags chromium's own services try to
# connect out, which a closed network refuses (and logs as errors).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1100",
]
READOUT = re.compile(r"^(?:query (\d+) · )?key (\d+) · (?:weight|relevance|norm) (\S+) ± (\S+) · ")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is missing"
    return None


def require_browser() -> None:
    """Fail (in CI) or skip (elsewhere) with the reason, unless chromium, chromedriver and selenium are here."""
    missing = _missing()
    if missing:
        message = f"the browser test needs chromium, chromedriver and selenium: {missing}; install with {INSTALL}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)


def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="/nonexistent/chromium is missing"):
        require_browser()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium chromium-driver"):
        require_browser()


@pytest.fixture
def browser(tmp_path):
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which(CHROMIUM) or CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _read(driver):
    """(query or None, key, value, bound) from the readout under the pointer."""
    text = driver.find_element("id", "readout").text
    match = READOUT.match(text)
    assert match, f"unexpected readout {text!r}"
    query, key, value, bound = match.groups()
    return (None if query is None else int(query)), int(key), float(value), float(bound)


def _hover_patch(driver, token, grid=4, click=False):
    """Move the pointer to the centre of patch ``token`` (1..16 on the 4x4 grid), and click there if asked."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = driver.find_element("id", "image-canvas")
    cell = canvas.size["width"] / grid
    p = token - 1
    # Selenium 4 measures offsets from the element's centre.
    x = (p % grid + 0.5) * cell - canvas.size["width"] / 2
    y = (p // grid + 0.5) * cell - canvas.size["height"] / 2
    actions = ActionChains(driver).move_to_element_with_offset(canvas, int(x), int(y))
    (actions.click() if click else actions).perform()


def _select(driver, element_id, value):
    from selenium.webdriver.support.select import Select

    Select(driver.find_element("id", element_id)).select_by_value(str(value))


def test_page_shows_the_recorded_attention_rollout_and_relevance(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, num_classes=6, dim=32, depth=3, heads=2, mlp_dim=64).eval()
    images = torch.rand(2, 3, 16, 16)
    page = write_explorer(model, images, tmp_path / "explore.html", titles=["first", "second"])
    logits, maps = record_attention(model, images)  # maps (l, b, h, n, n), n = 17
    top = logits.softmax(-1).topk(5, dim=-1).indices
    relevance = attention_relevance(model, images, top)  # (b, k, n, n)
    rollout = attention_rollout(maps)

    browser.get(page.resolve().as_uri())
    WebDriverWait(browser, 20).until(lambda d: d.find_element("tag name", "body").get_attribute("data-ready"))

    # Image 1, layer 1, head 1; click patch token 6 to make it the query; read 3 keys.
    _select(browser, "image-select", 1)
    _select(browser, "layer-select", 1)
    _select(browser, "head-select", 1)
    _hover_patch(browser, 6, click=True)
    for key in (6, 11, 16):
        _hover_patch(browser, key)
        query, shown_key, value, bound = _read(browser)
        assert (query, shown_key) == (6, key)
        expected = maps[1, 1, 1, 6, key].item()
        rowmax = maps[1, 1, 1, 6].max().item()
        assert abs(value - expected) <= bound, (key, value, expected, bound)
        assert bound <= 1.02 * (rowmax / 510 + 5e-7) + 1e-9  # the stated bound is the quantisation's, not looser

    # The class token as the query and as a key, on the mean of heads.
    _select(browser, "head-select", "mean")
    class_token = browser.find_element("id", "class-token")
    class_token.click()
    ActionChains(browser).move_to_element(class_token).perform()
    query, key, value, bound = _read(browser)
    assert (query, key) == (0, 0)
    assert abs(value - maps[1, 1, :, 0, 0].mean().item()) <= bound

    # Rollout, class token's row, on a patch key.
    _select(browser, "view-select", "rollout")
    _hover_patch(browser, 9)
    query, key, value, bound = _read(browser)
    assert (query, key) == (0, 9)
    assert abs(value - rollout[1, 0, 9].item()) <= bound

    # Relevance for the image's second class, clicked in the prediction list.
    browser.find_elements("css selector", "#predictions li")[1].click()
    assert browser.find_element("id", "view-select").get_attribute("value") == "relevance"
    for key in (1, 9):
        _hover_patch(browser, key)
        query, shown_key, value, bound = _read(browser)
        assert (query, shown_key) == (0, key)
        assert abs(value - relevance[1, 1, 0, key].item()) <= bound, (key, value, relevance[1, 1, 0, key])

    # Token norms of layer 2, read for a patch; a click on a chart picks that chart's layer.
    _select(browser, "view-select", "norms")
    _select(browser, "layer-select", 2)
    _, norms = token_norms(model, images)
    _hover_patch(browser, 14)
    query, key, value, bound = _read(browser)
    assert (query, key) == (None, 14)
    assert abs(value - norms[2, 1, 14].item()) <= bound
    chart = browser.find_element("id", "chart-entropy")
    left = chart.size["width"] / 2 - 52  # the plot starts 52 px from the chart's left edge (PAD.left)
    column = (chart.size["width"] - 52 - 8) / 3
    ActionChains(browser).move_to_element_with_offset(chart, int(-left + 0.5 * column), 0).click().perform()
    assert browser.find_element("id", "layer-select").get_attribute("value") == "0"

    shot = tmp_path / "explorer.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
