"""docs/dashboard-schedule.png: the dashboard's schedule page over a realistic small load.

    python bench/schedule_screenshot.py --dsn postgresql://root@127.0.0.1:5432/postgres

In a scratch database of its own (created, migrated, dropped): the first 80 requests of the
bundled Azure trace from eight tenants (t00 the runaway; `pgqueue replay --limit 80 --speedup
20`: tiers from each request's origin and SLA, costs from its tokens), a dozen jobs of a second
model (another lane) from three of them, t03 on plan pro; then a claim of 8 (as a worker's;
its jobs stay running) so that the first round is under way, and a fold of what is left, so
that every due job has its key. The page is shot in headless Chromium (Debian's
chromium and chromium-driver, through selenium, as tests/dashboard does) at 1400 x 1000.
The browser tests shoot the other pages (`PGQUEUE_DASHBOARD_SCREENSHOTS=docs`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgqueue
from pgqueue.dashboard.app import DashboardConfig
from pgqueue.dashboard.server import running_dashboard
from pgqueue.db import migrate

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = "pgqueue_schedule_shot"
SECOND_MODEL = "claude-sonnet-4-5"
REPLAY = ("--limit", "80", "--speedup", "20", "--tenants", "8", "--dsn")


def _load(dsn: str) -> None:
    """The trace's first 80 requests, a second lane, claims under way, a fold."""
    subprocess.run(
        [sys.executable, "-c", "from pgqueue.cli import app; app()", "replay", *REPLAY, dsn],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pgqueue.tenant_set('t03', plan => 'pro')")
        for i in range(12):
            tenant = ("t01", "t03", "t05")[i % 3]
            origin, sla = (("user_action", None), ("scheduled", 600.0), ("batch_job", None))[i // 4]
            pgqueue.enqueue(
                conn,
                tenant_id=tenant,
                origin=origin,
                sla_seconds=sla,
                payload={
                    "model": SECOND_MODEL,
                    "max_tokens": 512,
                    "messages": [{"role": "user", "content": "Summarise: " + "lorem " * 400 * i}],
                },
            )
        conn.commit()
        conn.execute("SELECT id FROM pgqueue.claim(8, 'worker-1', 600)").fetchall()
        conn.commit()
        conn.execute("SELECT pgqueue.fold(u.lane, u.tier) FROM pgqueue.lane_tiers_due() u")
        conn.commit()


def _shoot(url: str, out: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never download a driver
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        raise SystemExit("apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    with tempfile.TemporaryDirectory() as profile:
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            f"--user-data-dir={profile}",
        ):
            options.add_argument(arg)
        chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        try:
            chrome.get(url + "/schedule")
            chrome.save_screenshot(str(out))
        finally:
            chrome.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a server where databases can be created")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard-schedule.png")
    parser.add_argument("--scratch", default=SCRATCH, help="the scratch database's name")
    args = parser.parse_args()
    name = sql.Identifier(args.scratch)
    scratch = make_conninfo(args.dsn, dbname=args.scratch)
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(name))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
    try:
        migrate.upgrade(scratch)
        _load(scratch)
        # a long refresh: the page is shot as first rendered
        with running_dashboard(DashboardConfig(dsn=scratch, refresh_seconds=60)) as url:
            _shoot(url, args.out)
        print(f"wrote {args.out}")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


if __name__ == "__main__":
    main()
