"""What a person sees: both examples' runs in TensorBoard, opened in headless Chromium (Debian's ``chromium``)
driven by Playwright. The HTTP data behind these pages is tested in test_keras.py and test_lightning.py; here the
rendered pages are: the Time Series cards of the ``fitprof/`` scalars with both runs' values in their data tables,
the Profile tab's session list and the Keras run's overview page, and each run's trace viewer finding its steps.

Screenshots go to ``$FITPROF_SCREENSHOT_DIR`` when set (else a temporary folder); ``docs/`` holds copies.
Without Chromium or the ``playwright`` package (no ``playwright install``: it drives the system browser) each test
is skipped with the reason (``pytest -rs`` lists them), so a run shows which checks it did not make.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def _find_chromium() -> tuple[str | None, str]:
    """The Chromium binary, or None and why not. ``FITPROF_CHROMIUM``, when set, is the only place looked at: a
    wrong setting is said, never covered by another browser found elsewhere."""
    given = os.environ.get("FITPROF_CHROMIUM")
    if given:
        path = shutil.which(given)
        return path, f"FITPROF_CHROMIUM={given} is not an executable Chromium"
    for candidate in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        if path := shutil.which(candidate):
            return path, ""
    return None, "Chromium not found (/usr/bin/chromium; Debian: apt-get install chromium; or set FITPROF_CHROMIUM)"


CHROMIUM, NO_CHROMIUM = _find_chromium()
try:
    from playwright import sync_api
except ImportError:
    sync_api = None
NO_PLAYWRIGHT = (
    "playwright, the Python driver, is not installed (pip install playwright; no `playwright install`: it drives "
    "the system Chromium)"
)
# Looked up, not imported: the frameworks load in the fixture that trains, so a run that skips every test here (no
# Chromium: test_browser_skips.py) never pays TensorFlow's import. Keras takes its backend from KERAS_BACKEND first.
_MISSING = [name for name in ("keras", "tensorflow", "lightning") if importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)}"),
    pytest.mark.skipif(os.environ["KERAS_BACKEND"] != "tensorflow", reason="needs KERAS_BACKEND=tensorflow"),
]

# The flags Debian's Chromium needs here: root (no sandbox), no GPU, and none of its background traffic (which
# floods a closed network). Playwright gives each launch a fresh, empty --user-data-dir.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
TIMEOUT_MS = 60_000
STEPS = 5  # the default window, steps 6-10
MARKERS = {"keras": "train", "lightning": "ProfilerStep"}  # the step events' names in each trace
TOOL_TITLES = {
    "overview_page": "Overview Page",
    "trace_viewer": "Trace Viewer",
    "input_pipeline_analyzer": "Input Pipeline Analysis",
}
INPUT_STATEMENT = re.compile(r"([\d.]+)\s*% of the total step time sampled is waiting for input")
"""xprof's input-pipeline verdict, e.g. "Your program is HIGHLY input-bound because 86.4% of the total step time
sampled is waiting for input."."""
if sync_api is not None:
    sync_api.expect.set_options(timeout=TIMEOUT_MS)  # pages load slowly on 2 busy CPU cores


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both examples, one epoch each, into ``<tmp>/logs/keras`` and ``<tmp>/logs/lightning``."""
    import keras_digits
    import lightning_digits

    logs = tmp_path_factory.mktemp("browser") / "logs"
    keras_reports = keras_digits.main(["--logdir", str(logs / "keras"), "--epochs", "1"])
    lightning_profiler = lightning_digits.main(["--logdir", str(logs / "lightning"), "--epochs", "1", "--slow-input"])
    out: dict[str, Any] = {
        "logs": logs,
        "reports": {"keras": keras_reports[0], "lightning": lightning_profiler.reports[0]},
    }
    for name in ("keras", "lightning"):
        (session,) = {p.parent.name for p in (logs / name).glob("plugins/profile/*/*.xplane.pb")}
        out[name] = f"{name}/{session}"  # the Profile tab's name for the run's one window
    return out


@pytest.fixture(scope="module")
def tb(runs: dict[str, Any]) -> Iterator[str]:
    """TensorBoard over ``<tmp>/logs``, once it has loaded both runs' scalars and profiles."""
    from tbserver import get, tensorboard, wait_for

    with tensorboard(runs["logs"]) as base:
        profiles = {runs["keras"], runs["lightning"]}
        assert wait_for(lambda: profiles <= set(get(base, "/data/plugin/profile/runs"))), profiles

        def scalars_loaded() -> bool:
            tags = get(base, "/data/plugin/scalars/tags")
            return all("fitprof/input_percent" in tags.get(run, {}) for run in ("keras", "lightning"))

        assert wait_for(scalars_loaded)
        yield base


@pytest.fixture(scope="module", autouse=True)
def _needs_a_browser() -> None:
    """Each test is skipped with the reason when Chromium or playwright is missing; autouse and module-scoped, so
    it runs before the module's fixtures train the runs."""
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    if sync_api is None:
        pytest.skip(NO_PLAYWRIGHT)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert sync_api is not None and CHROMIUM is not None
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, timeout=TIMEOUT_MS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, tb: str) -> Iterator[Any]:
    """A fresh page that reaches TensorBoard only: anything else (Google Charts, fonts) is refused at once, so the
    page behaves the same on a closed CI network and on a laptop."""
    context = browser.new_context(viewport=VIEWPORT)
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(tb) else route.abort())
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("FITPROF_SCREENSHOT_DIR")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


TB_HEADER_RGB = (245, 124, 0)  # TensorBoard's orange top bar (#f57c00)


def _screenshot(pg: Any, path: Path) -> None:
    """Take the screenshot and check, from its decoded pixels, that it shows TensorBoard with something drawn:
    the viewport's size, TensorBoard's orange header band across the top, and below it a page that is not blank
    (many distinct colours and some ink: text, plots, the timeline)."""
    import numpy as np
    from PIL import Image

    pg.wait_for_timeout(500)  # let the last frame paint
    pg.screenshot(path=str(path))
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (VIEWPORT["width"], VIEWPORT["height"]), (path, img.size)
        rgb = np.asarray(img.convert("RGB")).astype(int)
    header = (np.abs(rgb[:40] - TB_HEADER_RGB).sum(axis=2) <= 12).mean()
    assert header > 0.5, (path, header)  # TensorBoard's own page, not an error page
    body = rgb[80:].reshape(-1, 3)
    colors = len(np.unique(body, axis=0))
    non_white = (body.sum(axis=1) < 3 * 245).mean()
    # The screenshots in docs/ have 431-1,688 colours and 2.2-21% non-white pixels below the header.
    assert colors > 200 and non_white > 0.01, (path, colors, non_white)


def _card_values(page: Any, key: str) -> dict[str, float]:
    """The values the Time Series card of ``fitprof/<key>`` shows in its data table, by run."""
    card = page.locator("scalar-card").filter(has_text=f"fitprof/{key}")
    sync_api.expect(card.locator("tb-truncated-path")).to_have_attribute("title", f"fitprof/{key}")
    rows = card.locator("tb-data-table-content-row")
    sync_api.expect(rows).to_have_count(2)  # one row per run in the card's data table
    headers = [h.strip() for h in card.locator("tb-data-table-header-cell").all_inner_texts()]
    run_col, value_col = headers.index("Run"), headers.index("Value")
    shown = {}
    for i in range(2):
        cells = [c.strip() for c in rows.nth(i).locator("tb-data-table-content-cell").all_inner_texts()]
        shown[cells[run_col]] = float(cells[value_col])
    return shown


# ------------------------------------------------------------------------------------------------------- tests
def test_time_series_shows_fitprof_cards_with_both_runs(page: Any, tb: str, runs: dict[str, Any], shots: Path) -> None:
    expect = sync_api.expect
    query = urllib.parse.urlencode({"tagFilter": "fitprof/(input_percent|step_time_ms)$"})
    page.goto(f"{tb}/?{query}#timeseries")
    for key in ("input_percent", "step_time_ms"):
        shown = _card_values(page, key)
        assert set(shown) == {"keras", "lightning"}, shown
        for run, value in shown.items():
            assert value == pytest.approx(getattr(runs["reports"][run], key), abs=1e-3), (key, run)
    expect(page.get_by_text("Tags matching filter")).to_be_visible()
    page.get_by_role("button", name="Close side pane").click()  # the settings pane, for a clearer picture
    _screenshot(page, shots / "tensorboard_scalars.png")


def _xprof(page: Any) -> Any:
    """The Profile tab's content: xprof's own page in TensorBoard's plugin iframe."""
    return page.frame_locator("main iframe").first


def _open_tool(page: Any, tb: str, run: str, tool: str) -> Any:
    """Open the Profile tab on ``run``'s ``tool`` through the address TensorBoard itself writes when a person picks
    them (``?run=…&tag=…&host=…#profile``); check xprof's drop-downs show that run and tool; return xprof's frame."""
    from tbserver import get

    tag = next(t for t in get(tb, "/data/plugin/profile/run_tools", run=run) if t.rstrip("@") == tool)
    hosts = get(tb, "/data/plugin/profile/hosts", run=run, tag=tag)
    host = hosts[0]["hostname"] if isinstance(hosts[0], dict) else hosts[0]
    page.goto(f"{tb}/?{urllib.parse.urlencode({'run': run, 'tag': tag, 'host': host})}#profile")
    xprof = _xprof(page)
    selects = xprof.get_by_role("combobox")  # sessions, tools, hosts
    sync_api.expect(selects.nth(0)).to_have_text(run)
    sync_api.expect(selects.nth(1)).to_have_text(TOOL_TITLES[tool])
    return xprof


def test_profile_tab_lists_both_runs(page: Any, tb: str, runs: dict[str, Any]) -> None:
    expect = sync_api.expect
    page.goto(f"{tb}/#timeseries")
    page.get_by_role("tab", name=re.compile("^profile$", re.I)).click()  # the tab in TensorBoard's header
    xprof = _xprof(page)
    expect(xprof.get_by_text("Sessions (2)")).to_be_visible()
    xprof.get_by_role("combobox").first.click()
    options = xprof.get_by_role("option")
    expect(options).to_have_count(2)
    assert sorted(o.strip() for o in options.all_inner_texts()) == sorted([runs["keras"], runs["lightning"]])


def test_keras_overview_page(page: Any, tb: str, runs: dict[str, Any], shots: Path) -> None:
    expect = sync_api.expect
    xprof = _open_tool(page, tb, runs["keras"], "overview_page")
    expect(xprof.get_by_text("Performance Summary")).to_be_visible()
    expect(xprof.get_by_text("Host Compute Time")).to_be_visible()
    _screenshot(page, shots / "profile_overview_keras.png")


@pytest.mark.parametrize("framework", ["keras", "lightning"])
def test_trace_viewer_draws_the_steps(page: Any, tb: str, runs: dict[str, Any], shots: Path, framework: str) -> None:
    expect = sync_api.expect
    xprof = _open_tool(page, tb, runs[framework], "trace_viewer")
    viewer = xprof.frame_locator("iframe[src*='trace_viewer']")
    # The timeline is drawn: the host's process track and its canvas are on screen.
    expect(viewer.locator(".process-track-name").filter(has_text="/host:CPU").first).to_be_visible()
    expect(viewer.locator("canvas").first).to_be_visible()
    # The viewer's own search finds the five step markers among the drawn events.
    find = viewer.get_by_placeholder("Find Events...")
    find.fill(MARKERS[framework])
    find.press("Enter")
    expect(viewer.locator("#hitCount")).to_have_text(re.compile(rf"\bof {STEPS}$"))
    if framework == "lightning":
        _screenshot(page, shots / "trace_viewer_lightning.png")


def test_lightning_input_pipeline_page_shows_the_input_share_of_the_scalar_card(
    page: Any, tb: str, runs: dict[str, Any], shots: Path
) -> None:
    """The Profile tab's input-pipeline page of the Lightning ``--slow-input`` run: xprof's own verdict names the
    share of step time spent waiting for input, and it is the ``fitprof/input_percent`` the Time Series card shows,
    compared like with like: xprof's step is the whole ``ProfilerStep`` marker, fitprof's leaves its own
    ``fitprof/overhead`` spans out, so the page shows fitprof's input time over the whole marker (within 0.5
    percentage point, as in test_xspace_agreement.py: xprof averages its per-step shares and prints one decimal).
    Under load the overhead spans grew to 1.3 pp of the step, and the page read 68.8% against the card's 70.1%."""
    query = urllib.parse.urlencode({"tagFilter": "fitprof/input_percent$"})
    page.goto(f"{tb}/?{query}#timeseries")
    card = _card_values(page, "input_percent")["lightning"]
    assert card == pytest.approx(runs["reports"]["lightning"].input_percent, abs=1e-3)
    assert card > 50  # --slow-input: the run is input-bound
    xprof = _open_tool(page, tb, runs["lightning"], "input_pipeline_analyzer")
    statement = xprof.get_by_text(INPUT_STATEMENT).first
    sync_api.expect(statement).to_be_visible()
    match = INPUT_STATEMENT.search(statement.inner_text())
    assert match, statement.inner_text()
    print(f"input share: scalar card {card}%, xprof's input-pipeline page {match.group(1)}%")  # shown with -s
    report = runs["reports"]["lightning"]
    marker_percent = 100 * report.input_ms_per_step / (report.step_time_ms + report.self_ms_per_step)
    assert abs(float(match.group(1)) - marker_percent) <= 0.5, (match.group(1), marker_percent, card)
    _screenshot(page, shots / "profile_input_pipeline_lightning.png")
