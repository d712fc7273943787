"""bench/report.py shows the `tenants` scenario's fairness: Jain's index (a target row and the
section) and each tenant's and plan's wait, whatever of it the results hold."""

from __future__ import annotations

from bench import report

MACHINE = {
    "cpus": 2, "torch": "2", "device": "cpu", "model_threads": 1, "date": "today",
    "load_average_at_start": [0.5],
}  # fmt: skip


def written(tmp_path, results: dict) -> str:
    report.write_report({"machine": MACHINE, **results}, tmp_path)
    return (tmp_path / "README.md").read_text()


def test_the_section_shows_the_index_and_every_tenants_and_plans_wait(tmp_path):
    text = written(
        tmp_path,
        {
            "tenants": {
                "jain_index": 0.934,
                "tenants": {
                    "flood": {"plan": "pro", "jobs": 5000, "wait_p50_ms": 850.0,
                              "wait_p99_ms": 2100.0},
                    "quiet-a": {"plan": "pro", "jobs": 20, "wait_p50_ms": 40.0,
                                "wait_p99_ms": 95.0},
                    "quiet-b": {"plan": "free", "jobs": 20, "wait_p50_ms": 61.0,
                                "wait_p99_ms": 120.0},
                },
            }
        },
    )  # fmt: skip
    assert "## Fairness between tenants" in text
    assert "**0.934**" in text
    assert (
        "| Jain's index over backlogged tenants, plan-weighted (tenants scenario) | 0.934 | "
        "≥ 0.9 | met |" in text
    )
    assert "| flood | pro | 5,000 | 850 ms | 2,100 ms |" in text
    assert "| quiet-b | free | 20 | 61 ms | 120 ms |" in text
    # Per plan, from the tenants: jobs added up, waits as the range over its tenants.
    assert "| pro | 5,020 | 40–850 ms (tenants) | 95–2,100 ms (tenants) |" in text
    assert "| free | 20 | 61 ms | 120 ms |" in text


def test_a_missed_index_is_a_missed_target(tmp_path):
    rows = report.targets({"tenants": {"jain_index": 0.6}})
    assert [(value, ok) for name, value, _, ok in rows if "Jain" in name] == [("0.600", False)]


def test_missing_figures_show_as_dashes_and_no_scenario_no_section(tmp_path):
    text = written(
        tmp_path,
        {"tenants": {"per_tenant": [{"tenant": "t1"}, {"name": "t2", "plan": "enterprise"}],
                     "plans": {"enterprise": {"wait_p99_ms": 12.0}}}},
    )  # fmt: skip
    assert "| t1 | – | – | – | – |" in text
    assert "| t2 | enterprise | – | – | – |" in text
    assert "| enterprise | – | – | 12 ms |" in text
    assert "Jain" not in text
    assert "Fairness between tenants" not in written(tmp_path, {})


def test_the_position_eta_errors_are_shown(tmp_path):
    eta = {
        "all": {"jobs": 250, "error_p50_ms": 120.0, "error_p90_ms": 480.0},
        "flooding_tenant": {"jobs": 238, "error_p50_ms": 130.0, "error_p90_ms": 500.0},
        "quiet_tenants": {"jobs": 12, "error_p50_ms": 20.0, "error_p90_ms": 60.0},
    }
    text = written(tmp_path, {"tenants": {"jain_index": 0.99, "position_eta": eta}})
    assert "| all (250) | 120 ms | 480 ms |" in text
    assert "| the quiet tenants' (12) | 20 ms | 60 ms |" in text


def test_the_quiet_tenants_bound_and_the_bulk_are_target_rows():
    tenants = {
        "flood_beside_quiet": {
            "quiet": {"wait_p99_ms": 324.0},
            "quiet_p99_target_ms": 345.0,
            "quiet_p99_met": True,
        },
        "bulk_beside_others": {"others_refused": 3, "others_sent": 200, "met": False},
    }
    rows = {name: (value, ok) for name, value, _, ok in report.targets({"tenants": tenants})}
    quiet = next(v for name, v in rows.items() if name.startswith("quiet tenants' wait p99"))
    assert quiet == ("324 ms", True)
    bulk = next(v for name, v in rows.items() if "100,000-text bulk" in name)
    assert bulk == ("3 of 200", False)
