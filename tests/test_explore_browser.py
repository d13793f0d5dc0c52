"""The explorer page in a real browser (Debian's chromium + chromedriver, driven by selenium): after every step of
several click sequences, the heat map's colours, its colour scale, the legend and the row the page names are the
recorded numbers of that row, to the precision the page states; strings from files show literally and run nothing;
two models side by side show their own prefix tokens (registers named) and DINO's masks, driven by one set of
controls; and there is no console error. One browser session serves every test.

In CI (CI=true) a missing browser, driver or selenium is a failure, so the test cannot vanish silently; on a
developer machine it is skipped with the reason and the install command.
"""

import itertools
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
import torch
from _interop import perturbed
from _tiny import TINY_RGB16, tiny_vit
from test_explore_stats import HOSTILE, class_sink

from vit_einops import ViT
from vit_einops.explore import write_explorer
from vit_einops.inspect import (
    METHODS,
    attention_relevance,
    attention_rollout,
    explain,
    record_attention,
    token_norms,
)

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




@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which(CHROMIUM) or CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver, page):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page.resolve().as_uri())
    WebDriverWait(driver, 20).until(lambda d: d.find_element("tag name", "body").get_attribute("data-ready"))


def _console_errors(driver):
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _read(driver):
    """(query or None, key, value, bound) from the readout under the pointer."""
    text = driver.find_element("css selector", "#pane-0 .readout").text
    match = READOUT.match(text)
    assert match, f"unexpected readout {text!r}"
    query, key, value, bound = match.groups()
    return (None if query is None else int(query)), int(key), float(value), float(bound)


def _hover_patch(driver, token, grid=4, click=False, pane=0, prefix=1):
    """Move the pointer to the centre of patch ``token`` (prefix..prefix + grid^2 - 1 on the grid x grid patches) of
    pane ``pane``, and click there if asked."""
    canvas = driver.find_element("css selector", f"#pane-{pane} .image-canvas")
    size = canvas.size
    cell = size["width"] / grid
    p = token - prefix
    # Selenium 4 measures offsets from the element's centre.
    x = (p % grid + 0.5) * cell - size["width"] / 2
    y = (p // grid + 0.5) * cell - size["height"] / 2
    actions = _pointer(driver).move_to_element_with_offset(canvas, int(x), int(y))
    (actions.click() if click else actions).perform()


# The option of a select, whether it is selected and disabled, in one round trip (selenium's Select takes six).
OPTION = """
const option = document.getElementById(arguments[0]).querySelector(`option[value="${CSS.escape(arguments[1])}"]`);
return option && [option, option.selected, option.disabled];
"""


def _select(driver, element_id, value):
    """Choose ``value`` in the select ``element_id`` as selenium's Select does: a click on its option, where it is
    not already selected."""
    found = driver.execute_script(OPTION, element_id, str(value))
    assert found, f"no option {value!r} in #{element_id}"
    option, selected, disabled = found
    assert not disabled, f"option {value!r} of #{element_id} is disabled"
    if not selected:
        option.click()


def _pointer(driver):
    """ActionChains whose pointer moves take no time (selenium's default is a 250 ms glide): the page sees the same
    events at the end of each move."""
    from selenium.webdriver.common.action_chains import ActionChains

    return ActionChains(driver, duration=0)


# What the page shows, read in one round trip: texts by id, the scale's exact range, and the heat map's colour at
# the centre of each patch of the 4x4 grid (away from the grid lines and the query and hover boxes).
# Pane 0's heat map at the centre of each of its 4x4 patches, as `pixels`.
CENTRES = """
const canvas = document.querySelector("#pane-0 .image-canvas");
const ctx = canvas.getContext("2d");
const cell = canvas.width / 4;
const pixels = [];
for (let p = 0; p < 16; p++) {
  const x = Math.floor((p % 4 + 0.5) * cell), y = Math.floor((Math.floor(p / 4) + 0.5) * cell);
  pixels.push(Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3)));
}
"""
SHOWN = CENTRES + """
const pane = document.getElementById("pane-0");
const text = (name) => pane.querySelector("." + name).textContent;
const box = pane.querySelector(".colour-scale");
const ids = ["query-line", "footer-row", "view-note", "scale-line", "legend-query", "legend-hover", "legend-head",
  "legend-layer", "chart-note", "readout"];
return {min: Number(box.dataset.min), max: Number(box.dataset.max), pixels,
  text: Object.fromEntries(ids.map((id) => [id, text(id)]))};
"""

# The page's colour ramp (viridis at 9 points, linear between): the spec the pixels are checked against.
VIRIDIS = np.array(
    [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
     [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]], dtype=float,
)  # fmt: skip
STEEPEST = np.abs(np.diff(VIRIDIS, axis=0)).max() * (len(VIRIDIS) - 1)  # colour units per unit of t


def viridis(t: np.ndarray) -> np.ndarray:
    x = np.clip(t, 0, 1) * (len(VIRIDIS) - 1)
    i = np.minimum(np.floor(x).astype(int), len(VIRIDIS) - 2)
    return VIRIDIS[i] + (x - i)[:, None] * (VIRIDIS[i + 1] - VIRIDIS[i])


def token_name(token: int) -> str:
    if token == 0:
        return "token 0 (class token)"
    return f"token {token} (patch row {(token - 1) // 4}, col {(token - 1) % 4})"


class Recorded:
    """The model's numbers for one page, and the row each view should draw."""

    def __init__(self, model, images):
        self.logits, self.maps, _ = record_attention(model, images)  # maps (l, b, h, n, n)
        self.top = self.logits.softmax(-1).topk(5, dim=-1).indices
        self.relevance = attention_relevance(model, images, self.top).double()  # (b, k, n, n)
        self.rollout = attention_rollout(self.maps.double())
        self.norms = token_norms(model, images)[1].double()

    def row(self, view, image, layer=0, head="mean", query=0, rank=0):
        """(values over all 17 tokens, the page's stated bound on each)."""
        if view == "attention":
            rows = self.maps[layer, image, :, query].double()  # (h, n)
            rows = rows.mean(0) if head == "mean" else rows[head]
            rowmax = self.maps[layer, image, :, query].double().max(-1).values
            step = (rowmax.mean() if head == "mean" else rowmax[head]) / 255
            return rows.numpy(), float(step / 2)
        if view == "norms":
            return self.norms[layer, image].numpy(), 5e-5
        matrix = (self.rollout[image] if view == "rollout" else self.relevance[image, rank]).numpy()
        values = matrix[query]
        return values, float(np.abs(values).max() * 2**-11 + np.abs(matrix).max() * 2**-24)


def check_view(driver, recorded, view, *, image, layer=0, head="mean", query=0, rank=0, hover=None):
    """After a step of a sequence: the colour scale's range, the legend, the row named (under the picture and in
    the footer) and the colours drawn are those of ``view``'s row ``query``."""
    shown = driver.execute_script(SHOWN)
    text = shown["text"]
    values, bound = recorded.row(view, image, layer, head, query, rank)
    peak = values[1:].max()
    assert shown["min"] == 0 and abs(shown["max"] - peak) <= bound + 1e-12, (view, shown["max"], peak)
    printed = re.search(r"linear from 0 \(dark blue\) to (\S+) \(yellow\)", text["scale-line"])
    assert printed and float(printed.group(1)) == pytest.approx(shown["max"], rel=5e-4, abs=1e-300), text
    t = values[1:] / peak if peak > 0 else np.zeros(16)
    tolerance = STEEPEST * (bound / peak if peak > 0 else 0) + 1.5
    drawn = np.array(shown["pixels"], dtype=float)
    assert np.abs(drawn - viridis(t)).max() <= tolerance, (view, query, drawn, viridis(t))
    if view == "norms":
        assert "no query row" in text["query-line"] and "none, token norms have no query" in text["legend-query"]
    else:
        named = f"row {query}: query {token_name(query)}"
        assert named in text["query-line"] and named in text["footer-row"], text
        assert text["legend-query"].endswith(token_name(query))
    assert text["footer-row"] == f"Drawn over the patches: {text['query-line']}."
    assert text["legend-hover"] == f"hovered key (red box): {'none' if hover is None else token_name(hover)}"
    assert ("mean of heads" if head == "mean" else f": head {head}") in text["legend-head"]
    assert f"layer {layer}" in text["legend-layer"]
    if view in ("rollout", "relevance") and query != 0:
        assert f"Shown: row {query}, the clicked patch's" in text["view-note"]
    if hover is not None:
        shown_query, key, value, printed_bound = _read(driver)
        assert (shown_query, key) == (None if view == "norms" else query, hover)
        assert abs(value - values[hover]) <= printed_bound, (view, hover, value, values[hover])
        if view == "attention":  # the printed bound is the quantisation's (and the printing's), not looser
            assert printed_bound <= 1.02 * (bound + 5e-7) + 1e-9
    return text


def test_every_view_after_each_step_of_several_click_sequences(browser, tmp_path):
    torch.manual_seed(0)
    model = class_sink(tiny_vit(TINY_RGB16, depth=3, heads=2))  # layer 0, head 0 looks at the class token alone
    images = torch.rand(2, 3, 16, 16)
    page = write_explorer(model, images, tmp_path / "explore.html", titles=["first", "second"])
    recorded = Recorded(model, images)
    _open(browser, page)
    browser.execute_script(  # an opaque heat map: each patch's colour is its value's, unmixed with the picture
        "const o = document.getElementById('opacity'); o.value = 100; o.dispatchEvent(new Event('input'));"
    )

    # 1. As opened: attention, layer 0, mean of heads, the class token's row.
    text = check_view(browser, recorded, "attention", image=0)
    assert text["chart-note"].endswith("n/a (attends only to the prefix tokens), patch mass 0: layer 0 head 0")

    # 2. Layer 2, head 1; click patch 6 (the query), then hover patch 11.
    _select(browser, "layer-select", 2)
    _select(browser, "head-select", 1)
    _hover_patch(browser, 6, click=True)
    _hover_patch(browser, 11)
    check_view(browser, recorded, "attention", image=0, layer=2, head=1, query=6, hover=11)

    # 3. Rollout, then relevance: both keep the clicked patch's row, and say so (under the picture and below).
    _select(browser, "view-select", "rollout")
    check_view(browser, recorded, "rollout", image=0, layer=2, head=1, query=6, hover=11)
    _select(browser, "view-select", "relevance")
    check_view(browser, recorded, "relevance", image=0, layer=2, head=1, query=6, hover=11)

    # 4. The class token as the query, then the second class from the prediction list.
    class_token = browser.find_element("css selector", '#pane-0 .prefix-tokens li[data-name="cls"]')
    class_token.click()
    browser.find_elements("css selector", "#pane-0 .predictions li")[1].click()
    _pointer(browser).move_to_element(class_token).perform()
    check_view(browser, recorded, "relevance", image=0, layer=2, head=1, query=0, rank=1, hover=0)

    # 5. Second image, back to attention, the class-token head of layer 0: its row has nothing on the patches.
    _select(browser, "image-select", 1)
    _select(browser, "view-select", "attention")
    _select(browser, "layer-select", 0)
    _select(browser, "head-select", 0)
    _hover_patch(browser, 16)
    text = check_view(browser, recorded, "attention", image=1, layer=0, head=0, query=0, hover=16)
    assert "puts no weight on any patch" in text["view-note"]

    # 6. Click patch 1 then patch 9, mean of heads; rollout of that row; token norms of layer 1.
    _hover_patch(browser, 1, click=True)
    _hover_patch(browser, 9, click=True)
    _select(browser, "head-select", "mean")
    check_view(browser, recorded, "attention", image=1, layer=0, query=9, hover=9)
    _select(browser, "view-select", "rollout")
    check_view(browser, recorded, "rollout", image=1, query=9, hover=9)
    _select(browser, "view-select", "norms")
    _select(browser, "layer-select", 1)
    _hover_patch(browser, 14)
    check_view(browser, recorded, "norms", image=1, layer=1, query=9, hover=14)

    # A click on a chart picks that chart's layer.
    chart = browser.find_element("css selector", "#pane-0 .chart-entropy")
    left = chart.size["width"] / 2 - 52  # the plot starts 52 px from the chart's left edge (PAD.left)
    column = (chart.size["width"] - 52 - 8) / 3
    _pointer(browser).move_to_element_with_offset(chart, int(-left + 2.5 * column), 0).click().perform()
    assert browser.find_element("id", "layer-select").get_attribute("value") == "2"
    check_view(browser, recorded, "norms", image=1, layer=2, query=9)
    assert _console_errors(browser) == []


def test_strings_from_files_show_literally_and_run_nothing_and_identity_relevance_says_why(browser, tmp_path):
    model = tiny_vit(TINY_RGB16)
    model.reset_classifier(5, class_names=HOSTILE)  # zero-initialised: relevance is the identity
    titles = [*HOSTILE[:3], "<img src=x onerror='window.pwned = 1'>"]
    page = write_explorer(model, torch.rand(4, 3, 16, 16), tmp_path / "hostile.html", titles=titles)
    _open(browser, page)
    shown = browser.execute_script(
        "return {options: Array.from(document.querySelectorAll('#image-select option'), (o) => o.textContent),"
        " predictions: Array.from(document.querySelectorAll('#pane-0 .predictions li'), (li) => li.textContent),"
        " pwned: window.pwned === undefined ? null : window.pwned, scripts: document.scripts.length};"
    )
    assert shown["options"] == [f"{i}: {title}" for i, title in enumerate(titles)]
    names = sorted(item.split(" (class ")[0] for item in shown["predictions"])
    assert names == sorted(HOSTILE)
    assert shown["pwned"] is None and shown["scripts"] == 2  # the data block and the page's own code
    _select(browser, "view-select", "relevance")
    note = browser.find_element("css selector", "#pane-0 .view-note").text
    assert note.startswith("Relevance is the identity matrix for this class") and "zero-initialised" in note
    assert float(browser.find_element("css selector", "#pane-0 .colour-scale").get_attribute("data-max")) == 0
    assert _console_errors(browser) == []




def test_two_models_side_by_side_with_register_tokens_and_dino_masks(browser, tmp_path):
    from test_explore_models import PREFIX, loop_mask, model_files

    from vit_einops.commands.cli import main
    from vit_einops.modelfile import load_vit

    files, photo = model_files(tmp_path, "photo.jpg")
    page = tmp_path / "x.html"
    args = [str(files["reg"]), str(files["plain"]), "--image", str(photo), "--out", str(page), "--top-k", "1"]
    assert main(["explore", *args]) == 0
    _open(browser, page)
    text = lambda selector: browser.find_element("css selector", selector).get_attribute("textContent")  # noqa: E731
    attribute = lambda selector, name: browser.find_element("css selector", selector).get_attribute(name)  # noqa: E731
    panes = browser.find_elements("css selector", "#panes .pane")
    assert [pane.find_element("css selector", ".pane-name").text for pane in panes] == [
        "reg.safetensors",
        "plain.safetensors",
    ]
    # The register tokens are named beside the first map, the class token alone beside the second.
    names = "return Array.from(document.querySelectorAll('#pane-%d .prefix-tokens li'), (li) => li.dataset.name);"
    assert browser.execute_script(names % 0) == PREFIX and browser.execute_script(names % 1) == ["cls"]
    assert text('#pane-0 .prefix-tokens li[data-name="reg1"]').startswith("reg1 (token 1, register token 1): ")
    compare = text("#compare-line")
    assert "layers 2 vs 3; heads 2 vs 4; patch grid 4×4 vs 2×2" in compare
    assert "prefix tokens cls, reg1, reg2, reg3, reg4 vs cls" in compare
    norms = text("#pane-0 .norm-line")
    assert norms.startswith("after layer 0: prefix tokens cls ") and ", reg4 " in norms and "patches: median" in norms

    # One selector drives both; where a model has fewer layers or heads it shows its last and says so.
    _select(browser, "layer-select", 2)
    _select(browser, "head-select", 3)
    assert text("#pane-0 .clamp-note") == (
        "this model has 2 layers: layer 2 is past its last, layer 1 is shown; "
        "this model has 2 heads: head 3 is past its last, head 1 is shown"
    )
    assert text("#pane-1 .clamp-note") == "" and "layer 2, head 3, row 0" in text("#pane-1 .query-line")
    # A patch clicked in one model is the patch under its centre in the other: (row 1, col 0) of the 2x2 grid
    # is (row 3, col 1) of the 4x4 one.
    _hover_patch(browser, 3, grid=2, click=True, pane=1)
    assert text("#pane-1 .query-line").endswith("row 3: query token 3 (patch row 1, col 0)")
    assert text("#pane-0 .query-line").endswith("row 18: query token 18 (patch row 3, col 1)")

    # DINO's view: the last layer's class-token row, and the mask of each head and of their mean.
    models = [load_vit(files[name]).eval() for name in ("reg", "plain")]
    last = [record_attention(model, str(photo))[1][-1, 0].double() for model in models]  # (h, n, n)
    browser.execute_script(
        "const o = document.getElementById('opacity'); o.value = 100; o.dispatchEvent(new Event('input'));"
    )
    _select(browser, "view-select", "dino")
    for head in ("mean", 1):
        _select(browser, "head-select", head)
        for index, (rows, prefix) in enumerate(zip(last, (5, 1), strict=True)):
            row = (rows.mean(0) if head == "mean" else rows[head])[0, prefix:].numpy()
            kept = np.flatnonzero(loop_mask(row))
            line = f"#pane-{index} .dino-line"
            assert attribute(line, "data-mask") == ",".join(map(str, kept))
            assert f"the {len(kept)} highest of {len(row)} patches that hold 60% of the class token's" in text(line)
    assert text("#pane-0 .query-line") == "attention A, layer 1, head 1, row 0: query token 0 (class token)"
    # The mask darkens the patches outside it and leaves those inside as they were.
    masked = np.array(browser.execute_script(CENTRES + "return pixels;"), dtype=float)
    browser.find_element("id", "mask-toggle").click()
    plain = np.array(browser.execute_script(CENTRES + "return pixels;"), dtype=float)
    assert text("#pane-0 .dino-line").endswith("(mask hidden)")
    inside = np.zeros(16, dtype=bool)
    inside[list(map(int, attribute("#pane-0 .dino-line", "data-mask").split(",")))] = True
    assert np.abs(masked[inside] - plain[inside]).max() <= 1
    np.testing.assert_allclose(masked[~inside], plain[~inside] * 0.55, atol=1.5)
    assert _console_errors(browser) == []


def test_a_model_without_a_class_token_beside_a_distilled_one_draws_every_view(browser, tmp_path):
    """SigLIP's layout (no prefix token at all, attention pooling) in pane 0, a distilled DeiT (class and
    distillation tokens) in pane 1: every view draws in both panes without a script error, pane 0 lists no prefix
    token and says it has no DINO mask, pane 1 names "cls" and "dist" and draws its mask."""
    from vit_einops import ViT
    from vit_einops.explore import write_explorer

    torch.manual_seed(0)
    small = dict(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=3)
    siglip = ViT(**small, class_token=False, pool="map").eval()
    deit = ViT(**small, distill_token=True).eval()
    page = write_explorer([siglip, deit], torch.rand(1, 3, 32, 32), tmp_path / "p.html", preprocessed=True,
                          names=["siglip", "deit"], top_k=1)  # fmt: skip
    _open(browser, page)
    for view in ("attention", "dino", "rollout", "relevance", "norms", "method"):
        _select(browser, "view-select", view)
        assert _console_errors(browser) == [], view
    prefix = [browser.find_elements("css selector", f"#pane-{i} .prefix-tokens li") for i in (0, 1)]
    assert prefix[0] == [] and [li.text.split()[0] for li in prefix[1]] == ["cls", "dist"]
    _select(browser, "view-select", "dino")
    line = browser.find_element("css selector", "#pane-0 .dino-line").text
    assert line == "DINO's mask: none, this model has no class token"
    mask = browser.find_element("css selector", "#pane-1 .dino-line").get_attribute("data-mask")
    assert mask != "" and all(0 <= int(p) < 16 for p in mask.split(","))


def test_every_method_is_a_view_labelled_with_its_parameters(browser, tmp_path):
    """The method view draws, method by method, explain()'s map of that method with the parameters the page was
    written with (its label names them), to float16's precision: the colour scale's top, each patch's colour."""
    torch.manual_seed(1)  # a model where every map, Grad-CAM's ReLU included, is positive somewhere
    model = perturbed(tiny_vit(TINY_RGB16, depth=3, heads=2), std=0.2)
    images = torch.rand(2, 3, 16, 16)
    params = {"rollout": {"head_fusion": "max", "discard_ratio": 0.5}, "relevance": {"start_layer": 1}}
    page = write_explorer(model, images, tmp_path / "m.html", method_params=params, preprocessed=True)
    _open(browser, page)
    browser.execute_script(
        "const o = document.getElementById('opacity'); o.value = 100; o.dispatchEvent(new Event('input'));"
    )
    _select(browser, "image-select", 1)
    options = browser.execute_script(
        "return Array.from(document.querySelectorAll('#method-select option'), (o) => [o.value, o.textContent]);"
    )
    labels = {name: METHODS[name].label(params.get(name), every=True) for name in METHODS}
    assert options == [list(item) for item in labels.items()]
    _select(browser, "view-select", "method")  # the first method, chosen already: selecting it changes nothing
    for name, label in labels.items():
        _select(browser, "method-select", name)
        shown = browser.execute_script(SHOWN)
        values = explain(model, images, name, preprocessed=True, **params.get(name, {}))[1].flatten().double()
        peak = values.max().item()
        assert peak > 0, name
        assert abs(shown["max"] - peak) <= peak * 2**-10, (name, shown["max"], peak)
        drawn = np.array(shown["pixels"], dtype=float)
        assert np.abs(drawn - viridis((values / peak).numpy())).max() <= STEEPEST * 2**-10 + 1.5, name
        assert shown["text"]["query-line"] == f"{label} (the patch grid; no query row)"
        assert shown["text"]["legend-query"] == "query (dashed white box): none, a method's map has no query"
        assert shown["text"]["view-note"].startswith(f"{label}: {METHODS[name].reference}.")
        assert ("It explains the top class" in shown["text"]["view-note"]) == METHODS[name].gradient
        assert browser.find_element("id", "view-select").get_attribute("value") == "method"
    assert _console_errors(browser) == []


def test_a_headless_models_page_shows_no_class_and_its_target_relevance(browser, tmp_path):
    """A model without a classifier (num_classes 0, a SigLIP-like tower): no predictions, no class anywhere in the
    page's visible text, the relevance view off without a target; with a patch target, the one entry is it."""
    from vit_einops import ViT
    from vit_einops.explore import write_explorer
    from vit_einops.inspect import PatchTarget

    torch.manual_seed(0)
    tower = ViT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=0, pool="map").eval()
    no_class = re.compile(r"class \d|predict|probabilit|logit", re.I)
    for target in (None, PatchTarget(1, 2)):
        page = write_explorer(tower, torch.rand(1, 3, 32, 32), tmp_path / f"{target}.html", preprocessed=True,
                              target=target)  # fmt: skip
        _open(browser, page)
        views = ("attention", "dino", "rollout", "norms") + (() if target is None else ("relevance",))
        for view in views:  # without a target the relevance option is disabled (checked below)
            _select(browser, "view-select", view)
            assert _console_errors(browser) == [], view
            text = browser.find_element("css selector", "body").text
            assert not no_class.search(text), no_class.search(text)
        relevance = browser.find_element("css selector", "#relevance-option")
        items = [li.text for li in browser.find_elements("css selector", "#pane-0 .predictions li")]
        if target is None:
            assert relevance.get_attribute("disabled") and items == []
        else:
            assert relevance.get_attribute("disabled") is None
            assert items and items[0].startswith("the target (mean cosine similarity of the patches to patch (1, 2)): ")


# Each pane's canvas at the centre of each patch of its grid, as `pixels` per pane.
PANE_CENTRES = """
return [0, 1].map((i) => {
  const canvas = document.querySelector(`#pane-${i} .image-canvas`);
  const [gh, gw] = arguments[i];
  const ctx = canvas.getContext("2d");
  const pixels = [];
  for (let p = 0; p < gh * gw; p++) {
    const x = Math.floor(((p % gw) + 0.5) * canvas.width / gw);
    const y = Math.floor((Math.floor(p / gw) + 0.5) * canvas.height / gh);
    pixels.push(Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3)));
  }
  return pixels;
});
"""


def test_the_patch_pca_view_draws_each_models_own_colours_side_by_side(browser, tmp_path):
    """Registers beside none: at full opacity each pane's canvas shows, patch by patch, the uint8 colours its own
    payload carries (its own model's PCA), the hovered patch's colour is read out, and the note names dinov2 #469."""
    from test_explore import embedded
    from test_explore_models import decode_png, register_vit

    torch.manual_seed(0)
    models = [register_vit(), tiny_vit(TINY_RGB16, image_size=32, patch_size=16, depth=3)]
    page = write_explorer(models, torch.rand(2, 3, 32, 32), tmp_path / "p.html", names=["reg", "plain"], top_k=1)
    panes = embedded(page)["panes"]
    _open(browser, page)
    browser.execute_script(
        "const o = document.getElementById('opacity'); o.value = 100; o.dispatchEvent(new Event('input'));"
    )
    _select(browser, "view-select", "pca")
    for image in (0, 1):
        _select(browser, "image-select", image)
        drawn = browser.execute_script(PANE_CENTRES, *(pane["layout"]["grid"] for pane in panes))
        for pane, pixels in zip(panes, drawn, strict=True):
            codes = decode_png(pane["images"][image]["pca"]).reshape(-1, 3).astype(int)
            assert np.abs(np.array(pixels) - codes).max() <= 1, (pane["name"], image)
    _hover_patch(browser, 6, pane=0, prefix=5)
    codes = decode_png(panes[0]["images"][1]["pca"]).reshape(-1, 3)
    readout = browser.find_element("css selector", "#pane-0 .readout").text
    assert readout == "token 6 (patch row 0, col 1) · colour rgb({}, {}, {})".format(*codes[1])
    for i in (0, 1):
        note = browser.find_element("css selector", f"#pane-{i} .view-note").text
        assert "this model's own patch tokens" in note and "dinov2 issue #469" in note
        assert browser.find_element("css selector", f"#pane-{i} .colour-scale").is_displayed() is False
    assert _console_errors(browser) == []


def test_a_page_over_its_budget_side_by_side_shared_scale_token_chart_and_notes(browser, tmp_path):
    """The path a 518 px DINOv2 page takes, on tiny models: registers (over its attention budget: the mean of heads
    and the prefix rows kept) beside a SigLIP-like tower (no prefix token, all of it kept). A head's row of a patch
    query is named as left out; the mean of heads draws the recorded mean within its stated step; one colour scale
    for both takes the larger top; the token chart's names do not overlap; the similarity view draws the clicked
    patch's cosines; and the rollout note of a model without a class token does not ask for one."""
    from test_explore_models import register_vit

    torch.manual_seed(0)
    small = dict(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=3)
    models = [register_vit(), ViT(**small, class_token=False, pool="map").eval()]
    images = torch.rand(1, 3, 32, 32)
    page = write_explorer(models, images, tmp_path / "b.html", names=["reg", "siglip"], top_k=1,
                          attention_budget=2 * (2 * 5 * 21 + 21 * 21))  # fmt: skip
    _open(browser, page)
    text = lambda selector: browser.find_element("css selector", selector).get_attribute("textContent")  # noqa: E731
    scale = lambda i: browser.find_element("css selector", f"#pane-{i} .colour-scale")  # noqa: E731
    top = lambda i: float(scale(i).get_attribute("data-max"))  # noqa: E731
    assert text("#pane-0 .left-out").startswith("left out: each head's attention rows of the 16 patch queries")
    assert text("#pane-1 .left-out") == ""
    _hover_patch(browser, 10, click=True, pane=0, prefix=5)  # patch (row 1, col 1)
    _select(browser, "head-select", 1)
    assert text("#pane-0 .query-line") == (
        "nothing: head 1's row of token 10 (patch row 1, col 1) was left out of this page (see the note above the map)"
    )
    assert "keeps each head's rows of the prefix tokens and the mean of heads for every query" in text(
        "#pane-0 .view-note"
    )
    _select(browser, "head-select", "mean")
    maps = [record_attention(model, images)[1][0, 0].double() for model in models]  # layer 0: (h, n, n)
    mean = maps[0].mean(0)[10]
    step = mean.max().item() / 255  # the mean's own row, quantised on its own maximum
    assert abs(top(0) - mean[5:].max().item()) <= step / 2 + 1e-9
    own = [top(0), top(1)]
    browser.find_element("id", "shared-scale").click()
    assert top(0) == top(1) == max(own) and "one scale for both" in text("#pane-0 .scale-line")
    labels = json.loads(browser.find_element("css selector", "#pane-0 .token-chart").get_attribute("data-labels"))
    assert len(labels) == 6  # cls, reg1..reg4 and the patches' range
    for a, b in itertools.combinations(labels, 2):
        assert a[1] <= b[0] or b[1] <= a[0] or a[3] <= b[2] or b[3] <= a[2], (a, b)
    browser.find_element("id", "shared-scale").click()
    _select(browser, "view-select", "similarity")
    tokens = models[1].forward_features(images)[0].detach().double()
    cosines = torch.nn.functional.cosine_similarity(tokens, tokens[5][None], dim=-1)  # patch (1, 1) of siglip's grid
    assert abs(top(1) - cosines.max().item()) <= 2**-9 and cosines.max().item() == pytest.approx(1)
    _select(browser, "view-select", "rollout")
    note = text("#pane-1 .view-note")
    assert "This model has no class token" in note and "click the class token" not in note
    assert "click the class token" in text("#pane-0 .view-note")
    assert _console_errors(browser) == []


def test_a_siglip_like_tower_without_a_target_says_why_dino_and_the_gradient_methods_are_missing(browser, tmp_path):
    """No class token (attention pooling) and no classifier nor target: DINO's view is not offered (its option is
    disabled and says why), and the method list ends with a disabled entry naming the gradient methods and the
    flags that give them a target, rather than leaving them out unsaid."""
    from vit_einops import ViT
    from vit_einops.explore import write_explorer

    torch.manual_seed(0)
    tower = ViT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=0, class_token=False,
                pool="map").eval()  # fmt: skip
    _open(browser, write_explorer(tower, torch.rand(1, 3, 32, 32), tmp_path / "p.html", preprocessed=True))
    dino = browser.find_element("id", "dino-option")
    assert dino.get_attribute("disabled") and dino.text.endswith("(none: this model has no class token)")
    options = browser.find_elements("css selector", "#method-select option")
    offered = [o.get_attribute("value") for o in options if not o.get_attribute("disabled")]
    assert offered == [name for name, method in METHODS.items() if not method.gradient]
    gradient = ", ".join(name for name, method in METHODS.items() if method.gradient)
    assert options[-1].get_attribute("disabled") and options[-1].text == (
        f"{gradient}: not on this page; they need a target: this model has no classifier; pass --target-embedding "
        "FILE, --target-image PATH or --target-patch ROW,COL (target= in Python)"
    )
    assert _console_errors(browser) == []


def test_the_decomposition_view_draws_the_payloads_shares_and_a_clicked_heads_source_map(browser, tmp_path):
    """The decomposition view: an L x H grid of head cells and L MLP cells holding the payload's shares exactly, a
    logit-lens strip of L + 1; clicking a head selects it and draws its source map (the payload's float16 sources,
    each patch's colour within the stored precision), and the readout prints the head's share; another image
    brings its own numbers. A tower without a target does not offer the view and says why."""
    from test_explore import decode, embedded

    torch.manual_seed(0)
    model = perturbed(tiny_vit(TINY_RGB16, depth=3, heads=2), std=0.2)
    page = write_explorer(model, torch.rand(2, 3, 16, 16), tmp_path / "d.html", preprocessed=True, top_k=1)
    [pane] = embedded(page)["panes"]
    _open(browser, page)
    browser.execute_script(
        "const o = document.getElementById('opacity'); o.value = 100; o.dispatchEvent(new Event('input'));"
    )
    values = "return Array.from(document.querySelectorAll('#pane-0 .%s'), (c) => Number(c.dataset.value));"
    for image in (0, 1):
        _select(browser, "image-select", image)
        _select(browser, "view-select", "decomposition")
        numbers = pane["images"][image]["decomposition"]
        assert browser.execute_script(values % "head-cell") == [s for row in numbers["heads"] for s in row]
        assert browser.execute_script(values % "mlp-cell") == numbers["mlps"]
        assert browser.execute_script(values % "lens-cell") == numbers["lens"]
        sources = decode(numbers["sources"], np.float16, (3, 2, 17)).astype(np.float64) * numbers["sources_scale"]
        before = np.array(browser.execute_script(CENTRES + "return pixels;"), dtype=float)
        drawn_heads = [(l, h) for l in range(3) for h in range(2) if sources[l, h, 1:].max() > 0]  # not blank
        assert len(drawn_heads) >= 2
        for layer, head in (drawn_heads[-1], drawn_heads[0]):
            cell = f'#pane-0 .head-cell[data-layer="{layer}"][data-head="{head}"]'
            browser.find_element("css selector", cell).click()
            assert browser.find_element("id", "layer-select").get_attribute("value") == str(layer)
            assert browser.find_element("id", "head-select").get_attribute("value") == str(head)
            chosen = browser.find_elements("css selector", "#pane-0 .head-cell.chosen")
            assert [(c.get_attribute("data-layer"), c.get_attribute("data-head")) for c in chosen] == [
                (str(layer), str(head))
            ]
            shown = browser.execute_script(SHOWN)
            row = sources[layer, head]
            peak = row[1:].max()
            assert abs(shown["max"] - peak) <= peak * 2**-10, (shown["max"], peak)
            drawn = np.array(shown["pixels"], dtype=float)
            assert np.abs(drawn - viridis(row[1:] / peak)).max() <= STEEPEST * 2**-10 + 1.5
            assert not np.array_equal(drawn, before)  # the click changed the map
            before = drawn
            readout = browser.find_element("css selector", "#pane-0 .decomp-readout")
            share = numbers["heads"][layer][head]
            assert float(readout.get_attribute("data-share")) == share
            printed = re.fullmatch(rf"layer {layer}, head {head}: share (\S+) of the total (\S+)", readout.text)
            assert printed and float(printed[1]) == pytest.approx(share, rel=5e-6)
            assert float(printed[2]) == pytest.approx(numbers["total"], rel=5e-6)
            assert shown["text"]["query-line"] == (
                f"share of the score by source token, layer {layer}, head {head} (every source token; no query row)"
            )
    assert _console_errors(browser) == []
    tower = ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=0).eval()
    _open(browser, write_explorer(tower, torch.rand(1, 3, 16, 16), tmp_path / "t.html", preprocessed=True))
    option = browser.find_element("id", "decomposition-option")
    assert option.get_attribute("disabled") and "it would need a target: this model has no classifier" in option.text
    assert _console_errors(browser) == []
