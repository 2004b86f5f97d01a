"""A real Prometheus on loopback, and the demo it scrapes: shared by the
dashboard and alert tests.

Every wait here is for something Prometheus reports (a scrape that read a
count, a rule evaluation after it), never for a length of time.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import yaml

from helpers import stop_process

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "dashboards" / "prometheus.yml"
# What every wait allows before it fails the test: a guard, not a schedule.
WAIT_S = 120.0

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _seconds(rfc3339: str) -> float:
    """Prometheus' timestamps (nanoseconds, ``Z``) as Unix seconds; Python
    3.10's ``fromisoformat`` reads neither."""
    stamp, _, fraction = rfc3339.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc).timestamp()
    return whole + (float(f"0.{fraction}") if fraction else 0.0)


class Prometheus:
    """The shipped ``dashboards/prometheus.yml`` pointed at ``target_port``.

    ``interval``: scrape and evaluation interval instead of the shipped 15 s;
    ``rule_files``: instead of the shipped rules; ``job``: the scrape job's name;
    ``alertmanager_port``: send the alerts to an Alertmanager on 127.0.0.1
    (the shipped file's commented-out ``alerting`` section).
    """

    def __init__(
        self,
        tmp: Path,
        target_port: int,
        *,
        interval: str | None = None,
        rule_files: list[Path] | None = None,
        job: str | None = None,
        alertmanager_port: int | None = None,
    ) -> None:
        config = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
        if alertmanager_port is not None:
            targets = [f"127.0.0.1:{alertmanager_port}"]
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": targets}]}]}
        if interval is not None:
            config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
        shipped_rules = [SHIPPED.parent / name for name in config["rule_files"]]
        config["rule_files"] = [str(path) for path in (rule_files or shipped_rules)]
        [scrape] = config["scrape_configs"]
        scrape["static_configs"][0]["targets"] = [f"127.0.0.1:{target_port}"]
        if job is not None:
            scrape["job_name"] = job
        self.job = scrape["job_name"]
        path = tmp / "prometheus.yml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        binary = shutil.which("prometheus")
        assert binary, "Prometheus is missing: scripts/test installs Debian's 'prometheus'"
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, f"--config.file={path}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def _get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def api(self, path: str, **params: str) -> list:
        """A query endpoint's result (``query``, ``query_range``)."""
        return self._get(path, **params)["result"]

    def query(self, expr: str, at: float | None = None) -> list:
        params = {"query": expr} if at is None else {"query": expr, "time": str(at)}
        return self.api("query", **params)

    def label_values(self, selector: str, label: str) -> set[str]:
        """What Grafana's ``label_values(selector, label)`` lists."""
        series = self._get("series", **{"match[]": selector})
        return {each[label] for each in series if each.get(label)}

    def alerts(self) -> dict[str, str]:
        """The alerts now: name -> pending or firing."""
        return {a["labels"]["alertname"]: a["state"] for a in self._get("alerts")["alerts"]}

    def evaluated_after(self, at: float) -> float | None:
        """The last evaluation time every rule group has reached, once all
        of them were evaluated after ``at``."""
        groups = self._get("rules")["groups"]
        last = min(_seconds(group["lastEvaluation"]) for group in groups)
        return last if last > at else None

    def wait(self, condition: Callable[[], T | None], timeout: float = WAIT_S) -> T:
        """``condition()``'s first true value; polled until Prometheus says so."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = condition()
                if value:
                    return value
            except OSError:  # still starting
                pass
            time.sleep(0.25)
        raise AssertionError(f"not within {timeout} s: {condition.__doc__ or condition}")

    def scraped_total(self, metric: str, total: float) -> float:
        """The timestamp of the scrape that read ``sum(metric) == total``."""
        return self.scraped_totals({metric: total})

    def scraped_totals(self, totals: dict[str, float]) -> float:
        """The timestamp of a scrape that read ``sum(metric) == total`` for
        every metric of ``totals`` (the counts are final once the demo
        printed them: a later scrape reads the same)."""

        def scraped() -> float | None:
            for metric, total in totals.items():
                result = self.query(f"sum({metric})")
                if not result and total == 0:
                    continue  # a histogram without an observation has no series
                if not result or float(result[0]["value"][1]) != total:
                    return None
            [up] = self.query(f'timestamp(up{{job="{self.job}"}})')
            return float(up["value"][1])

        scraped.__doc__ = f"Prometheus has read the sums {totals}"
        return self.wait(scraped)

    def close(self) -> None:
        stop_process(self.process)


class ScrapedDemo:
    """``mcp-resumption demo --json --prometheus-port``, holding its metrics
    endpoint up until closed; ``rows`` is its JSON, printed before the hold."""

    def __init__(self, metrics_port: int, scenarios: list[str] | None = None) -> None:
        args = [str(Path(sys.executable).with_name("mcp-resumption")), "demo", "--json",
                "--prometheus-port", str(metrics_port), "--hold", "3600"]  # fmt: skip
        for name in scenarios or []:
            args += ["--scenario", name]
        # Its stderr (progress lines, a one-line error) kept to say why, if it fails.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        self.rows: list[dict] = json.loads(self._read_json())
        # A row that cannot run here (the task rows without fastmcp-tasks, the
        # server-alone rows on mcp 1.x) says skipped: every other one passes.
        assert all(row["pass"] or row.get("skipped") for row in self.rows), self.rows

    def _read_json(self) -> str:
        assert self.process.stdout is not None
        lines = []
        for line in self.process.stdout:
            lines.append(line)
            if line.rstrip() == "]":
                return "".join(lines)
        self.process.wait()
        self._stderr.seek(0)
        raise AssertionError(
            f"the demo ended (exit code {self.process.returncode}) without its JSON: "
            f"{''.join(lines)!r}; its stderr:\n{self._stderr.read()[-4000:]}"
        )

    @property
    def attempts(self) -> int:
        """Every resume attempt the demo counted."""
        return self.total("attempts")

    def total(self, counted: str) -> int:
        """What the demo counted on one of its ``counted`` keys, in every row."""
        return sum(sum(row["counted"][counted].values()) for row in self.rows)

    @property
    def totals(self) -> dict[str, int]:
        """The demo's last counts, by metric: a scrape that read them all
        read every count (the subscription row counts no attempt at all, so
        the attempts alone may be final before it ran)."""
        return {
            "mcp_client_resumption_attempts_total": self.attempts,
            "mcp_client_resumption_lost_subscriptions_total": self.total("lost_subscriptions"),
            "mcp_client_resumption_reissues_total": self.total("reissues"),
            "mcp_client_resumption_broken_requests_total": self.total("fates"),
            "mcp_client_resumption_duplicate_runs_total": self.total("duplicate_runs"),
            "mcp_client_resumption_event_gaps_total": self.total("event_gaps"),
            "mcp_client_resumption_event_streams_total": self.total("event_streams"),
            "mcp_client_operation_duration_seconds_count": sum(
                n["count"] for row in self.rows for n in row["counted"]["operations"].values()
            ),
        }

    def close(self) -> None:
        stop_process(self.process)
        self._stderr.close()
