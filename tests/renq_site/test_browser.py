"""The admin and the API docs page in headless Chromium, served by the real gunicorn alone:
static files must come from the app server (WhiteNoise) and the docs page must not need the
internet (drf-spectacular-sidecar)."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from .helpers import RUN_DIR, VENV_BIN, ChildProcess, child_database_url, free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def gunicorn_url(django_db_setup) -> Iterator[str]:
    """gunicorn on a free port against pytest-django's test database."""
    port = free_port()
    web = ChildProcess(
        "test-gunicorn",
        [str(VENV_BIN / "gunicorn"), "renq_site.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1"],
        env={"DATABASE_URL": child_database_url()},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        web.wait_until(lambda: requests.get(f"{url}/healthz", timeout=1).ok, "gunicorn", 30)
        yield url
    finally:
        web.stop()


@pytest.fixture
def browser():
    if not CHROMIUM.exists() or not Path(CHROMEDRIVER).exists():
        pytest.skip(
            "needs /usr/bin/chromium and chromedriver "
            "(`apt-get install chromium chromium-driver`; `make test` does it)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = RUN_DIR / f"chromium-profile-{secrets.token_hex(4)}"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={profile}",
        # Offline except for our server: a page that needs a CDN fails to render.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(
        options=options,
        service=Service(executable_path=CHROMEDRIVER, log_output=str(RUN_DIR / "chromedriver.log")),
    )
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_gunicorn_serves_static_files(gunicorn_url):
    response = requests.get(f"{gunicorn_url}/static/admin/css/base.css", timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/css")
    assert "#header" in response.text


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)  # committed, so gunicorn's connection sees the user
def test_admin_is_styled_after_login(gunicorn_url, browser):
    from django.contrib.auth import get_user_model
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    password = secrets.token_urlsafe(12)
    get_user_model().objects.create_superuser("ops-admin", "ops@example.com", password)

    browser.get(f"{gunicorn_url}/admin/login/?next=/admin/")
    browser.find_element(By.ID, "id_username").send_keys("ops-admin")
    browser.find_element(By.ID, "id_password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 15).until(expected_conditions.url_to_be(f"{gunicorn_url}/admin/"))
    WebDriverWait(browser, 15).until(
        expected_conditions.presence_of_element_located((By.ID, "site-name"))
    )
    RUN_DIR.mkdir(exist_ok=True)
    browser.save_screenshot(str(RUN_DIR / "admin.png"))

    base_css_rules = browser.execute_script(
        "const sheet = [...document.styleSheets].find("
        "  s => s.href && s.href.endsWith('/static/admin/css/base.css'));"
        # cssRules throws when the "stylesheet" was not CSS (a 404 page, say).
        "try { return sheet ? sheet.cssRules.length : -1; } catch (e) { return -2; }"
    )
    assert base_css_rules > 50, "admin/css/base.css did not load"
    header = browser.execute_script(
        "const style = getComputedStyle(document.getElementById('header'));"
        "return {background: style.backgroundColor, display: style.display};"
    )
    # Unstyled, the header is a transparent block; base.css makes it a coloured flex bar.
    assert header["background"] not in ("rgba(0, 0, 0, 0)", "transparent"), header
    assert header["display"] == "flex", header
    assert "Site administration" in browser.page_source


@pytest.mark.browser
def test_api_docs_render_swagger_ui_offline(gunicorn_url, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{gunicorn_url}/api/docs/")
    operations = WebDriverWait(browser, 20).until(
        lambda driver: driver.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock")
    )
    browser.save_screenshot(str(RUN_DIR / "api-docs.png"))
    assert len(operations) >= 3
    assert "/api/v1/jobs" in browser.find_element(By.CSS_SELECTOR, ".swagger-ui").text
    # Every script, stylesheet and image came from our own server.
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(r => r.name)"
        ".concat([...document.scripts].map(s => s.src).filter(Boolean));"
    )
    foreign = [url for url in resources if not url.startswith(gunicorn_url)]
    assert foreign == [], foreign


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)  # committed, so gunicorn's connection sees the rows
def test_queue_page_shows_tenants_tiers_and_why_they_wait(gunicorn_url, browser, make_tenant,
                                                          make_service):  # fmt: skip
    from django.contrib.auth import get_user_model
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    from inference.models import Job

    acme, _ = make_tenant("acme-corp", plan="pro")
    globex, _ = make_tenant("globex-inc", plan="free")
    service = make_service("embedding", name="embed-browser")
    for tenant, tier, n in ((acme, "api", 2), (acme, "batch", 6), (globex, "batch", 3)):
        Job.objects.bulk_create(
            Job(tenant=tenant, service=service, tier=tier, input={"texts": ["x"]}) for _ in range(n)
        )
    password = secrets.token_urlsafe(12)
    user = get_user_model().objects.create_user("ops-staff", "ops@example.com", password)
    user.is_staff = True
    user.save()
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="view_job"))

    browser.get(f"{gunicorn_url}/admin/login/?next=/admin/")
    browser.find_element(By.ID, "id_username").send_keys("ops-staff")
    browser.find_element(By.ID, "id_password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 15).until(expected_conditions.url_to_be(f"{gunicorn_url}/admin/"))
    assert "renq administration" in browser.find_element(By.ID, "site-name").text
    # From the index, as an operator gets there: Queues, then the service.
    browser.find_element(By.CSS_SELECTOR, "#renq-queues-module caption a").click()
    WebDriverWait(browser, 15).until(expected_conditions.url_contains("/admin/queues/"))
    browser.find_element(By.LINK_TEXT, "embed-browser").click()
    table = WebDriverWait(browser, 15).until(
        expected_conditions.presence_of_element_located((By.ID, "renq-queue-lines"))
    )
    RUN_DIR.mkdir(exist_ok=True)
    browser.save_screenshot(str(RUN_DIR / "admin-queue.png"))
    rows = {
        (row.find_element(By.XPATH, "..").get_attribute("data-tier"),
         row.get_attribute("data-tenant")): row.text
        for row in table.find_elements(By.CSS_SELECTOR, "tr.renq-line")
    }  # fmt: skip
    assert set(rows) == {("api", "acme-corp"), ("batch", "acme-corp"), ("batch", "globex-inc")}
    assert "tenant_fair_share" in rows["batch", "globex-inc"]
    assert "tier_share" in rows["batch", "acme-corp"]
    assert "next_in_line" in rows["api", "acme-corp"]
    for tier in ("P1 api", "P2 batch"):
        assert tier in table.text
    # The bars are drawn: acme's 6 batch jobs fill the widest bar, globex's 3 half of it.
    widths = browser.execute_script(
        "return [...document.querySelectorAll('tr.renq-line .renq-bar > span')]"
        ".map(s => [s.closest('tr').dataset.tenant, s.closest('tbody').dataset.tier,"
        " s.getBoundingClientRect().width, s.parentElement.getBoundingClientRect().width]);"
    )
    drawn = {(tenant, tier): width / whole for tenant, tier, width, whole in widths}
    assert drawn["acme-corp", "batch"] == pytest.approx(1.0, abs=0.02)
    assert drawn["globex-inc", "batch"] == pytest.approx(0.5, abs=0.02)
    # Each reason explains itself on hover.
    reason = table.find_element(By.CSS_SELECTOR, "tr.renq-line .renq-reason.tenant_fair_share")
    assert "tenants take turns" in reason.get_attribute("title")
