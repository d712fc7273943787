"""Writes bench/results/README.md and the PNG plots from one run's results (results.json).

Every figure in the README comes from the run that wrote it; a section whose scenario did not
run (`--only`) is left out. The "what is left" paragraph is built from the same figures: for
each target missed, where the time went according to this run's CPU split and profile.
"""

from __future__ import annotations

import math
from pathlib import Path

CLIENTS = 8


def _f(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}f}"


def _status(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def targets(r: dict) -> list[tuple[str, str, str, bool | None]]:
    """(figure, this run, target, met) for every target of issues 9 and 8 this run measured."""
    rows: list[tuple[str, str, str, bool | None]] = []
    raw = r.get("raw", {}).get("batched_texts_s")
    if raw and "renq_drain" in r:
        x = r["renq_drain"]["throughput_jobs_s"] / raw
        rows.append(
            (
                "worker drain vs raw model batched (in-process, same threads)",
                f"{x:.2f} ×",
                "≥ 0.95 ×",
                x >= 0.95,
            )
        )
    if raw and "renq_e2e" in r:
        x = r["renq_e2e"]["throughput_jobs_s"] / raw
        rows.append(
            (
                "e2e single-text jobs over REST vs raw model batched",
                f"{x:.2f} ×",
                "≥ 0.90 ×",
                x >= 0.90,
            )
        )
    if "renq_e2e" in r and "plain_celery" in r:
        x = r["renq_e2e"]["throughput_jobs_s"] / r["plain_celery"]["throughput_jobs_s"]
        rows.append(
            (
                "e2e vs plain Celery (one task per job, same model, same worker)",
                f"{x:.2f} ×",
                "≥ 5 ×",
                x >= 5,
            )
        )
    noop = r.get("noop")
    if noop:
        s, b = noop["single"], noop["batched"]
        rows.append(
            (
                "no-op jobs accepted and completed per second, single-job POSTs",
                f"{_f(s['completed_jobs_s'], 0)}/s (accepted {_f(s['accepted_jobs_s'], 0)}/s)",
                "≥ 500/s",
                s["completed_jobs_s"] >= 500,
            )
        )
        rows.append(
            (
                "same, 100 jobs per POST",
                f"{_f(b['completed_jobs_s'], 0)}/s (accepted {_f(b['accepted_jobs_s'], 0)}/s)",
                "≥ 5,000/s",
                b["completed_jobs_s"] >= 5000,
            )
        )
    bulk = r.get("bulk")
    if bulk:
        rows.append(
            (
                f"{bulk['texts']:,}-text bulk job vs raw model batched",
                f"{bulk['ratio']:.2f} ×",
                "≥ 0.90 ×",
                bulk["ratio"] >= 0.90,
            )
        )
    idle = r.get("idle")
    if idle:
        p50, p99 = idle["scheduler_overhead_ms_p50"], idle["scheduler_overhead_ms_p99"]
        rows.append(
            (
                "idle realtime scheduler overhead p50 / p99",
                f"{_f(p50)} / {_f(p99)} ms",
                "≤ 10 / 25 ms",
                p50 <= 10 and p99 <= 25,
            )
        )
    if noop:
        s, b = noop["single"], noop["batched"]
        rows.append(
            (
                "CPU ms per job outside the model (no-op run, single-job POSTs)",
                f"{_f(s['cpu_ms_per_job'])} ms",
                "≤ 4 ms",
                s["cpu_ms_per_job"] <= 4,
            )
        )
        rows.append(
            (
                "same, 100 jobs per POST",
                f"{_f(b['cpu_ms_per_job'])} ms",
                "≤ 4 ms",
                b["cpu_ms_per_job"] <= 4,
            )
        )
    pr = r.get("priority")
    if pr:
        w = pr["with_budget"]
        p0 = w["p0"]
        rows.append(
            (
                "P0 queue wait p99 under saturation vs preemption budget + 20 ms "
                "(from created_at: the web's own time under load included)",
                f"{_f(p0['queue_wait_ms_p99'], 0)} ms (p50 {_f(p0['queue_wait_ms_p50'], 0)})",
                f"≤ {_f(p0['target_ms'], 0)} ms",
                p0["queue_wait_ms_p99"] <= p0["target_ms"],
            )
        )
        if "after_answer_ms_p99" in p0:
            rows.append(
                (
                    "same, from when its POST was answered (its message in RabbitMQ)",
                    f"{_f(p0['after_answer_ms_p99'], 0)} ms "
                    f"(p50 {_f(p0['after_answer_ms_p50'], 0)})",
                    f"≤ {_f(p0['target_ms'], 0)} ms",
                    p0["after_answer_ms_p99"] <= p0["target_ms"],
                )
            )
        rows.append(
            (
                "every P0 job ran locally and succeeded",
                f"{p0['succeeded_locally']} of {p0['sent']}",
                "all",
                p0["sent"] > 0 and p0["succeeded_locally"] == p0["sent"],
            )
        )
        left = pr["backlog"]["p3_queued_when_streams_ended"]
        rows.append(
            (
                "P3 backlog still queued when the P0 stream ended",
                f"{left:,} of {pr['backlog']['jobs']:,} jobs",
                "> 0",
                left > 0,
            )
        )
        share = w["completions_by_served_queue"]
        ratio = ":".join(f"{10 * share[t]['share']:.1f}" for t in ("api", "batch", "offline"))
        within = all(abs(share[t]["ratio_to_target"] - 1) <= 0.10 for t in share)
        rows.append(
            (
                "P1:P2:P3 completions while all three tier queues had work, before aging "
                "(by tier queue served)",
                ratio,
                "5:3:2 ± 10 %",
                within,
            )
        )
        bound = w["p3_aging_bound_with_interval_s"] + w["non_realtime_batches"]["run_ms_max"] / 1000
        longest = w["p3_longest_wait_in_own_queue_s"]
        rows.append(
            (
                "longest P3 wait in its own tier queue vs aging bound + aging interval + one batch",
                f"{_f(longest)} s",
                f"≤ {_f(bound)} s",
                longest <= bound,
            )
        )
        price = pr["price_of_the_bound"]
        rows.append(
            (
                "throughput with the preemption budget vs without (the price of the bound)",
                f"{price['ratio']:.2f} ×",
                "report",
                None,
            )
        )
        fair = pr.get("fairness")
        if fair:
            rows.append(
                (
                    "quiet tenant's wait p99 beside a 50 × flood, same tier: no quota / "
                    f"flood capped at max_running_jobs {fair['quota']['a_max_running_jobs']}",
                    f"{_f(fair['no_quota']['b_wait_ms_p99'] / 1000)} s / "
                    f"{_f(fair['quota']['b_wait_ms_p99'] / 1000)} s",
                    "report",
                    None,
                )
            )
    tenants = r.get("tenants", {})
    jain = tenants.get("jain_index")
    if jain is not None:
        rows.append(
            (
                "Jain's index over backlogged tenants, plan-weighted (tenants scenario)",
                f"{jain:.3f}",
                "≥ 0.9",
                jain >= 0.9,
            )
        )
    beside = tenants.get("flood_beside_quiet")
    if isinstance(beside, dict) and "quiet_p99_target_ms" in beside:
        rows.append(
            (
                "quiet tenants' wait p99 beside a 60 × flood of their tier vs 2 × alone + one "
                "batch (tenants scenario)",
                f"{_f(beside['quiet']['wait_p99_ms'], 0)} ms",
                f"≤ {_f(beside['quiet_p99_target_ms'], 0)} ms",
                beside["quiet_p99_met"],
            )
        )
    bulk = tenants.get("bulk_beside_others")
    if isinstance(bulk, dict):
        rows.append(
            (
                "other tenants' jobs refused while one tenant's 100,000-text bulk is queued "
                "(tenants scenario)",
                f"{bulk['others_refused']} of {bulk['others_sent']}",
                "0",
                bulk["met"],
            )
        )
    return rows


def what_is_left(r: dict, rows) -> list[str]:
    missed = {name for name, _, _, ok in rows if ok is False}
    notes: list[str] = []
    noop, prof = r.get("noop"), r.get("submit_profile")
    if noop and any("no-op" in m or "CPU ms" in m or "100 jobs per POST" in m for m in missed):
        s, b = noop["single"], noop["batched"]
        by = s["cpu_ms_per_job_by_role"]
        text = (
            f"**Submit path and stack cost.** A single-job POST costs {_f(s['cpu_ms_per_job'])} ms "
            f"of CPU across the stack (web {_f(by['web'])}, Postgres {_f(by['postgres'])}, "
            f"worker {_f(by['worker'])}, RabbitMQ {_f(by['rabbitmq'])}, Redis {_f(by['redis'])} "
            f"ms); on 2 cores that caps single-job POSTs near "
            f"{_f(2000 / max(s['cpu_ms_per_job'], 1e-9), 0)}/s before the client's own share. "
            f"Postgres opened {_f(s['pg_sessions_per_post'], 2)} sessions per POST"
        )
        if s["pg_sessions_per_post"] > 0.5:
            text += (
                " — a new connection (a forked backend, authentication, catalog caches) for "
                "nearly every request: Django under ASGI runs each request's sync view in a "
                "fresh thread, and connections are per thread, so `CONN_MAX_AGE` reuses nothing"
            )
        text += "."
        if prof:
            funcs = list(prof["by_function_ms_per_post"].items())[:5]
            text += (
                f" In-process, one POST takes {_f(prof['in_process_ms_per_post'])} ms "
                f"({_f(prof['in_process_cpu_ms_per_post'])} ms CPU of the web process); the "
                "profile's heaviest renq functions (library calls included): "
                + ", ".join(f"`{name}` {_f(ms, 2)} ms" for name, ms in funcs)
                + " (`submit_profile.txt`)."
            )
        bb = b["cpu_ms_per_job_by_role"]
        text += (
            f" With 100 jobs per POST the cost per job falls to {_f(b['cpu_ms_per_job'])} ms (web "
            f"{_f(bb['web'])}, Postgres {_f(bb['postgres'])}, RabbitMQ {_f(bb['rabbitmq'])}, "
            f"worker {_f(bb['worker'])}) and one POST of 100 takes "
            f"{_f(b['post_ms_p50'], 0)} ms (p50)."
        )
        notes.append(text)
    if any("drain" in m or "e2e" in m for m in missed) and "renq_e2e" in r and "raw" in r:
        e2e, drain, raw = r["renq_e2e"], r["renq_drain"], r["raw"]
        notes.append(
            f"**Model-bound paths.** The raw model does {_f(raw['batched_texts_s'])} texts/s in "
            f"batches of {raw['batch']} on {r['machine']['model_threads']} thread(s); the worker "
            f"drains {_f(drain['throughput_jobs_s'])} jobs/s, e2e over REST "
            f"{_f(e2e['throughput_jobs_s'])} jobs/s with REST submissions alone at "
            f"{_f(e2e['rest_submissions_s'])}/s from {CLIENTS} clients on one web process: the "
            "e2e figure is bounded by the slower of the two, and both share the cores the model "
            "does not have with Postgres and RabbitMQ."
        )
    bulk = r.get("bulk")
    if bulk and any("bulk" in m for m in missed):
        notes.append(
            f"**Bulk.** {bulk['pieces']} pieces of {bulk['texts_per_piece']} texts; the model was "
            f"busy {_f(100 * bulk['model_busy_fraction'], 0)} % of the bulk's "
            f"{_f(bulk['seconds'])} s; the rest is per-piece claim, store, acks and the chord "
            "callback, run between forward passes."
        )
    idle = r.get("idle")
    if idle and any("idle" in m for m in missed):
        notes.append(
            f"**Idle latency.** Of {_f(idle['scheduler_overhead_ms_p50'])} ms overhead (p50), "
            f"{_f(idle['queue_wait_ms_p50'])} ms is queue wait (created → forward pass started: "
            "commit, publish, delivery, claim, batch formation); the rest is storing the "
            "outcome after the pass."
        )
    pr = r.get("priority")
    if pr:
        w = pr["with_budget"]
        if any("P0 queue wait" in m for m in missed):
            nb = w["non_realtime_batches"]
            notes.append(
                "**P0 under saturation.** Non-realtime forward passes ran "
                f"{_f(nb['run_ms_p50'], 0)} ms p50, {_f(nb['run_ms_p99'], 0)} ms p99, "
                f"{_f(nb['run_ms_max'], 0)} ms max "
                f"against a {_f(nb['budget_ms'], 0)} ms budget; a P0 job waits for the pass "
                "running when it arrives, then for its own batch to be formed and claimed. A "
                f"job is never split: one job of {pr['big_job']['texts_per_job']} such texts ran "
                f"{_f(pr['big_job']['batch_run_ms_p50'], 0)} ms alone here, so with jobs of that "
                "shape no dispatch-time preemption can hold a 250 ms bound."
            )
        if any("P1:P2:P3" in m for m in missed):
            share = w["completions_by_served_queue"]
            notes.append(
                "**Weighted share.** Completions by tier queue served: "
                + ", ".join(f"{t} {share[t]['completed']}" for t in share)
                + f", while the queues were non-empty {_fr(w['queue_nonempty_fraction'])} of the "
                f"samples; jobs expired while waiting: {w['expired_by_tier'] or 'none'}; most jobs "
                f"claimed together, by tier queue: {w.get('jobs_per_claim_max_by_tier')}"
                + (
                    " (jobs that arrived in one dispatch message are claimed together)."
                    if max((w.get("jobs_per_claim_max_by_tier") or {"": 1}).values()) > 1
                    else "."
                )
            )
        if any("P3 wait" in m for m in missed):
            notes.append(
                f"**Aging.** The oldest unclaimed P3 job had waited "
                f"{_f(w['p3_longest_wait_in_own_queue_s'])} s in the offline queue; promotion runs "
                f"every {_f(pr['aging_interval_s'], 0)} s."
            )
    return notes


def _fr(fractions: dict) -> str:
    return ", ".join(f"{t} {100 * v:.0f} %" for t, v in fractions.items())


def write_report(r: dict, out: Path) -> None:
    m = r["machine"]
    rows = targets(r)
    lines = [
        "# renq bench results",
        "",
        f"Machine: {m['cpus']} CPUs (shared), torch {m['torch']}, device {m['device']}, model "
        f"threads {m['model_threads']} (raw and renq alike)"
        + (
            f", the model pinned to CPU(s) {m['model_cpus']} (raw and renq's forward passes "
            f"alike; `RENQ_MODEL_CPUS`) and the bench's clients, web and workers"
            + (
                " and the machine's PostgreSQL, RabbitMQ and Redis "
                f"({m['pinning']['server_threads_pinned']} threads)"
                if m.get("pinning", {}).get("server_threads_pinned")
                else " (not PostgreSQL, RabbitMQ and Redis: they could not be moved)"
            )
            + f" to {m['stack_cpus']} in the in-process, e2e and pool scenarios (no-op, bulk "
            "and priority unpinned)"
            if m.get("model_cpus")
            else ""
        )
        + f", {m['date']}; load average "
        f"{_f(m['load_average_at_start'][0], 2)} at the start, "
        f"{_f(m.get('load_average_at_end', [float('nan')])[0], 2)} at the end. Produced by "
        f"`make bench` in {_f(m.get('bench_seconds', float('nan')), 0)} s"
        + (" (**--quick**: reduced sizes, for development)" if r.get("quick") else "")
        + (
            f"; code at commit {m['commit']}"
            + (" with uncommitted changes" if m.get("uncommitted_changes") else "")
            if m.get("commit")
            else ""
        )
        + ". Every figure below is from this one run.",
        "",
        "## Targets (issues 9 and 8)",
        "",
        "| figure | this run | target | |",
        "|---|---:|---:|---|",
    ]
    lines += [
        f"| {name} | {value} | {target} | {_status(ok)} |" for name, value, target, ok in rows
    ]
    notes = what_is_left(r, rows)
    if notes:
        lines += ["", "### What is left", ""]
        for note in notes:
            lines += [note, ""]
    if "raw" in r or "renq_e2e" in r:
        lines += _throughput_section(r)
    if "noop" in r:
        lines += _noop_section(r)
    if "submit_profile" in r:
        lines += _profile_section(r["submit_profile"])
    if "bulk" in r:
        lines += _bulk_section(r["bulk"], r)
    if "idle" in r:
        lines += _idle_section(r["idle"])
    if "idle_pools" in r:
        lines += _pools_section(r["idle_pools"])
    if "priority" in r:
        lines += _priority_section(r["priority"])
    if "tenants" in r:
        lines += _tenants_section(r["tenants"])
    if "settings" in r:
        lines += _settings_section(r)
    if "padding" in r:
        lines += _padding_section(r["padding"])
    if "llm" in r:
        from bench.llm_serving import report_lines

        lines += ["", *report_lines(r["llm"])]
    if "fast_path" in r:
        from bench.fast_path import report_lines

        lines += ["", *report_lines(r["fast_path"])]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def _throughput_section(r: dict) -> list[str]:
    lines = ["", "## Throughput (all-MiniLM-L6-v2, one short text per job)", ""]
    if "raw" not in r:
        return lines + ["(the in-process scenario did not run: no raw reference)"]
    raw = r["raw"]
    base = raw["batched_texts_s"]
    lines += [
        "| path | texts/s | ratio |",
        "|---|---:|---:|",
        f"| raw model, one by one (in-process) | {raw['one_by_one_texts_s']:.1f} | "
        f"{raw['one_by_one_texts_s'] / base:.2f} × raw batched |",
        f"| raw model, batches of {raw['batch']} (in-process) | {base:.1f} | 1.00 |",
        f"| renq batch former + model (in-process, no broker) | "
        f"{raw['batch_former_texts_s']:.1f} | {raw['batch_former_texts_s'] / base:.2f} × raw "
        "batched |",
    ]
    pipeline = r.get("pipeline")
    if pipeline:
        lines.append(
            f"| renq batch former + pipelined loop (in-process, no broker: forming beside the "
            f"model thread, as the worker does; bench/inprocess_pipeline.py; raw in that run "
            f"{pipeline['raw_texts_s']:.1f}) | {pipeline['pipelined_texts_s']:.1f} | "
            f"{pipeline['ratio']:.2f} × raw batched in that run |"
        )
    beside = r.get("beside_python")
    if beside:
        lines += [
            f"| raw model, batches of {beside['batch']}, beside a thread running Python (as the "
            f"worker's loop runs beside its forward passes), traced forward pass (renq's) | "
            f"{beside['traced_texts_s']:.1f} | {beside['traced_texts_s'] / base:.2f} × raw "
            "batched |",
            f"| same, eager forward pass | {beside['eager_texts_s']:.1f} | "
            f"{beside['eager_texts_s'] / base:.2f} × raw batched |",
        ]
    if "renq_e2e" in r:
        e2e, drain, plain = r["renq_e2e"], r["renq_drain"], r["plain_celery"]
        lines += [
            f"| renq e2e: REST → Postgres → RabbitMQ → worker ({e2e['jobs']} jobs, {CLIENTS} "
            f"clients) | {e2e['throughput_jobs_s']:.1f} | {e2e['throughput_jobs_s'] / base:.2f} × "
            f"raw batched, {e2e['throughput_jobs_s'] / plain['throughput_jobs_s']:.2f} × plain "
            "Celery |",
            f"| renq worker drain: same jobs queued in RabbitMQ first, as plain Celery's, then "
            f"one worker ({drain['jobs']} jobs; first claim → last finish) | "
            f"{drain['throughput_jobs_s']:.1f} | "
            f"{drain['throughput_jobs_s'] / base:.2f} × raw batched, "
            f"{drain['throughput_jobs_s'] / plain['throughput_jobs_s']:.2f} × plain Celery |",
            f"| REST submissions alone (POST → 202, {CLIENTS} clients, 1 web process) | "
            f"{e2e['rest_submissions_s']:.1f} | {e2e['rest_submissions_s'] / base:.2f} × raw "
            "batched |",
            f"| plain Celery, one task per job, no batching ({plain['jobs']} jobs queued, then "
            "one worker) | "
            f"{plain['throughput_jobs_s']:.1f} | {plain['throughput_jobs_s'] / base:.2f} × raw "
            "batched |",
            "",
            f"REST answers 429/503 waited out and retried during the e2e run: "
            f"{e2e.get('refused_and_retried') or 'none'}.",
            "",
            f"renq e2e batch sizes: {e2e['batch_hist']}",
            "",
            f"renq drain batch sizes: {drain['batch_hist']}",
        ]
    return lines


def _noop_section(r: dict) -> list[str]:
    noop = r["noop"]
    lines = [
        "",
        "## The stack's own cost: no-op jobs (no model)",
        "",
        f"REST → Postgres → RabbitMQ → worker → result with the no-op model kind (`bench-noop`: "
        f"batch_size 256), gunicorn + uvicorn with {noop['web_workers']} web processes, one "
        f"worker ({noop.get('pool', 'prefork')}, concurrency 1); the clients run in the bench "
        "process. Job latency is finished − created; jobs per pass is the pass size the "
        "average job shared. Submissions run "
        "for a fixed time; completed/s = jobs ÷ (last finish − first POST). CPU is summed from "
        "/proc over the run for every process of the stack (`bench/cpu.py`: web and worker "
        "process groups; the Postgres server's auxiliary processes, its backends of the bench "
        "database and the connections it reaped; RabbitMQ; Redis). RabbitMQ, Redis and the "
        "reaped Postgres connections are whole-server figures: other work on this shared machine "
        "would show there too ('other' = machine busy − stack − client).",
        "",
        "| case | jobs | accepted/s | completed/s | POST p50 / p99 ms | job p50 / p99 ms | "
        "jobs per pass | CPU ms/job | web | "
        "Postgres | RabbitMQ | worker | Redis | PG sessions/POST | PG connections peak | "
        "client CPU s | other CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, case in (
        ("1 job per POST, 8 threads", noop["single"]),
        ("100 jobs per POST, 4 threads", noop["batched"]),
    ):
        by = case["cpu_ms_per_job_by_role"]
        lines.append(
            f"| {label} | {case['succeeded']:,} | {_f(case['accepted_jobs_s'], 0)} | "
            f"{_f(case['completed_jobs_s'], 0)} | {_f(case['post_ms_p50'], 0)} / "
            f"{_f(case['post_ms_p99'], 0)} | {_f(case.get('job_ms_p50'), 0)} / "
            f"{_f(case.get('job_ms_p99'), 0)} | {_f(case.get('jobs_per_pass'), 1)} | "
            f"{_f(case['cpu_ms_per_job'], 2)} | "
            f"{_f(by['web'], 2)} | "
            f"{_f(by['postgres'], 2)} | {_f(by['rabbitmq'], 2)} | {_f(by['worker'], 2)} | "
            f"{_f(by['redis'], 2)} | {_f(case['pg_sessions_per_post'], 2)} | "
            f"{case.get('pg_connections_peak', 'n/a')} | "
            f"{_f(case['cpu']['client_s'], 1)} | {_f(case['cpu']['other_s'], 1)} |"
        )
    lines += ["", "![CPU per job by process](noop_cpu.png)"]
    return lines


def _profile_section(p: dict) -> list[str]:
    lines = [
        "",
        "## Where a POST's time goes (pyinstrument, in-process)",
        "",
        f"{p['posts']} single-job POSTs through Django's test client (middleware, DRF, "
        "submit_job) against the real Postgres, RabbitMQ and Redis: "
        f"{_f(p['in_process_ms_per_post'], 2)} ms wall, {_f(p['in_process_cpu_ms_per_post'], 2)} "
        "ms CPU per POST (unprofiled). Full profile: [submit_profile.txt](submit_profile.txt).",
        "",
        "| layer (innermost frame) | ms/POST | | renq function (library calls included) "
        "| ms/POST |",
        "|---|---:|---|---|---:|",
    ]
    layers = list(p["by_layer_ms_per_post"].items())[:8]
    funcs = list(p["by_function_ms_per_post"].items())[:8]
    for i in range(max(len(layers), len(funcs))):
        left = layers[i] if i < len(layers) else ("", None)
        right = funcs[i] if i < len(funcs) else ("", None)
        lines.append(
            f"| {left[0]} | {_f(left[1], 2) if left[1] is not None else ''} | | "
            f"`{right[0]}` | {_f(right[1], 2) if right[1] is not None else ''} |"
        )
    return lines


def _bulk_section(b: dict, r: dict) -> list[str]:
    return [
        "",
        f"## Bulk: {b['texts']:,} short texts in one job",
        "",
        "`POST /api/v1/jobs/bulk` on a service with config.yaml's embedding settings "
        f"(pieces of {b['texts_per_piece']} texts, a Celery chord), one worker with the model on "
        f"{r['machine']['model_threads']} thread(s); raw = the same texts through the model in "
        "the bench process, in batches of the same size, half before and half after the bulk.",
        "",
        "| | texts/s | |",
        "|---|---:|---|",
        f"| raw model batched (before / after) | {_f(b['raw_texts_s'])} | "
        f"{_f(b['raw_before_texts_s'])} / {_f(b['raw_after_texts_s'])} |",
        f"| renq bulk job ({b['pieces']} pieces; POST answered in {_f(b['post_s'], 2)} s; "
        f"finished in {_f(b['seconds'])} s, {b['status']}) | {_f(b['texts_s'])} | "
        f"{b['ratio']:.2f} × raw; model busy {_f(100 * b['model_busy_fraction'], 0)} % |",
    ]


def _idle_section(idle: dict) -> list[str]:
    return [
        "",
        "## Idle realtime latency (sequential jobs)",
        "",
        f"Service `{idle['service']}`: config.yaml's embedding settings (the CPU profile). "
        "Scheduler overhead = (finished − created) − inference time, from the job's own "
        f"timestamps (n = {idle['n']}, after 5 warm-up jobs).",
        "",
        "| client e2e p50 (POST → result in Postgres) | queue wait p50 | inference p50 | "
        "overhead p50 | p95 | p99 | max |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {_f(idle['client_e2e_ms_p50'])} ms | {_f(idle['queue_wait_ms_p50'])} ms | "
        f"{_f(idle['inference_ms_p50'])} ms | {_f(idle['scheduler_overhead_ms_p50'])} ms | "
        f"{_f(idle['scheduler_overhead_ms_p95'])} ms | {_f(idle['scheduler_overhead_ms_p99'])} ms "
        f"| {_f(idle['scheduler_overhead_ms_max'])} ms |",
    ] + (
        [
            "",
            "Overhead by stage (p50): created → claimed "
            f"{_f(idle['stages_ms_p50']['to_claim'])} ms (commit, publish, delivery, task "
            f"start, claim), claimed → pass started {_f(idle['stages_ms_p50']['claim_to_start'])}"
            f" ms (formation, tokenizing), after the pass {_f(idle['stages_ms_p50']['after_pass'])}"
            " ms (storing).",
        ]
        if "stages_ms_p50" in idle
        else []
    )


def _pools_section(pools: dict) -> list[str]:
    lines = [
        "",
        "## Worker pool (idle realtime latency, same worker otherwise)",
        "",
        "| pool | client e2e p50 | queue wait p50 | inference p50 | overhead p50 | p95 | p99 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pool, idle in pools.items():
        lines.append(
            f"| {pool} | {_f(idle['client_e2e_ms_p50'])} ms | {_f(idle['queue_wait_ms_p50'])} ms"
            f" | {_f(idle['inference_ms_p50'])} ms | {_f(idle['scheduler_overhead_ms_p50'])} ms"
            f" | {_f(idle['scheduler_overhead_ms_p95'])} ms"
            f" | {_f(idle['scheduler_overhead_ms_p99'])} ms |"
        )
    return lines


def _priority_section(pr: dict) -> list[str]:
    svc = pr["service"]
    cap, big, bl = pr["capacity"], pr["big_job"], pr["backlog"]
    lines = [
        "",
        "## Priority under saturation (issue 8)",
        "",
        f"Service `bench-priority`: config.yaml's embedding settings (batch_size "
        f"{svc['batch_size']}, max_total_tokens {svc['max_total_tokens']}, queue_timeout "
        f"{svc['queue_timeout']} s, total_timeout {svc['total_timeout']} s, preemption_budget_s "
        f"{svc['preemption_budget_s']}; admission limits raised: {pr['overrides']}), a local-only "
        "route, one worker with the model on the bench's model threads, the control worker "
        f"(beat: expiry every second, aging every {_f(pr['aging_interval_s'], 0)} s). Tiers: "
        + ", ".join(
            f"{t} aging {v['aging_after_s']:g} s weight {v['weight']:g}"
            for t, v in pr["tiers"].items()
        )
        + ".",
        "",
        f"- Capacity: P3 jobs of {cap['texts_per_job']} text(s) of ~160 words run at "
        f"{_f(cap['jobs_per_minute'], 0)} jobs/minute ({_f(cap['batch_run_ms_p50'], 0)} ms per "
        f"pass p50, {_f(cap['jobs_per_batch_p50'], 0)} job(s) per pass). One job of "
        f"{big['texts_per_job']} such texts runs {_f(big['batch_run_ms_p50'], 0)} ms alone.",
        f"- Backlog: {bl['jobs']:,} P3 jobs = {_f(bl['x_capacity_per_minute'])} × the per-minute "
        f"capacity, submitted in {_f(bl['submit_s'])} s (lists of 100 per POST); "
        f"{bl['p3_queued_when_streams_ended']:,} still queued when the streams ended.",
        "- Streams (open loop): "
        + ", ".join(
            f"{t} {_f(s['rate_jobs_s'], 2)}/s ({s['sent']} sent, {s['refused']} refused)"
            for t, s in pr["streams"].items()
        )
        + "; P1 and P2 jobs have P3's shape and are offered at 1.5 × their 5:3:2 share of the "
        "capacity, so their queues stay non-empty.",
        "",
        "| | with the budget | without (budget 10^6 s) |",
        "|---|---:|---:|",
    ]
    w, n = pr["with_budget"], pr["without_budget"]

    def both(fn) -> str:
        return f"| {fn(w)} | {fn(n)} |"

    table = [
        ("seconds measured (saturated)", lambda x: _f(x["seconds"])),
        (
            "P0 sent / succeeded locally",
            lambda x: f"{x['p0']['sent']} / {x['p0']['succeeded_locally']}",
        ),
        ("P0 statuses", lambda x: str(x["p0"]["statuses"])),
        ("P0 backends", lambda x: str(x["p0"]["backends"])),
        (
            "P0 queue wait p50 / p99 / max (ms)",
            lambda x: (
                f"{_f(x['p0']['queue_wait_ms_p50'], 0)} / {_f(x['p0']['queue_wait_ms_p99'], 0)}"
                f" / {_f(x['p0']['queue_wait_ms_max'], 0)}"
            ),
        ),
        (
            "P0 wait after its POST was answered, p50 / p99 / max (ms)",
            lambda x: (
                f"{_f(x['p0'].get('after_answer_ms_p50'), 0)} / "
                f"{_f(x['p0'].get('after_answer_ms_p99'), 0)} / "
                f"{_f(x['p0'].get('after_answer_ms_max'), 0)}"
            ),
        ),
        (
            "non-realtime passes: count, run ms p50 / p99 / max",
            lambda x: (
                f"{x['non_realtime_batches']['count']}: "
                f"{_f(x['non_realtime_batches']['run_ms_p50'], 0)} / "
                f"{_f(x['non_realtime_batches']['run_ms_p99'], 0)} / "
                f"{_f(x['non_realtime_batches']['run_ms_max'], 0)}"
            ),
        ),
        (
            "completions by tier queue served (api:batch:offline), while all three had work",
            lambda x: (
                ":".join(
                    str(x["completions_by_served_queue"][t]["completed"])
                    for t in ("api", "batch", "offline")
                )
                + f" (over {x.get('share_measured_s', '?')} s)"
            ),
        ),
        ("completions by own tier", lambda x: str(x["completions_by_own_tier"])),
        (
            "most jobs claimed together, by tier queue",
            lambda x: str(x.get("jobs_per_claim_max_by_tier", "n/a")),
        ),
        (
            "tier queues non-empty (share of 1 s samples)",
            lambda x: _fr(x["queue_nonempty_fraction"]),
        ),
        ("expired while waiting, by tier", lambda x: str(x["expired_by_tier"] or "none")),
        (
            "longest P3 wait in the offline queue (s)",
            lambda x: _f(x["p3_longest_wait_in_own_queue_s"]),
        ),
        (
            "P3 wait of the jobs that started, p50 / max (s)",
            lambda x: f"{_f(x['p3_started_wait_s_p50'])} / {_f(x['p3_started_wait_s_max'])}",
        ),
        (
            "throughput: long jobs/s, texts/s, tokens/s",
            lambda x: (
                f"{_f(x['throughput_long_jobs_s'], 2)}, {_f(x['throughput_texts_s'], 1)}, "
                f"{_f(x['throughput_tokens_s'], 0)}"
            ),
        ),
    ]
    for label, fn in table:
        lines.append(f"| {label} {both(fn)}")
    lines += [
        "",
        f"The price of the bound: {pr['price_of_the_bound']['ratio']:.2f} × the throughput "
        "without it (texts/s). The measured window of each phase starts 5 s after its streams "
        "started. Aging bound for P3: aging_after_s "
        f"{_f(w['p3_aging_bound_s'], 0)} s + the aging interval; P3 jobs promoted over the whole "
        f"run: {w['p3_promoted']}.",
        "",
        "![wait per tier over the run](priority_waits.png)",
    ]
    fair = pr.get("fairness")
    if fair:
        lines += [
            "",
            "### Two tenants in one tier",
            "",
            f"Tenant A offers {_f(fair['no_quota']['offered_a_jobs_s'], 0)} jobs/s (lists of 25), "
            f"tenant B {_f(fair['no_quota']['offered_b_jobs_s'], 0)} jobs/s (single POSTs), both "
            f"`batch` tier, plan pro, short texts, for {_f(fair['no_quota']['seconds'], 0)} s; A "
            "waits out a 429's Retry-After.",
            "",
            "| | A offered / accepted | A refused (429) | B jobs | B wait p50 / p99 / max | "
            "A wait p50 |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for label, key in (
            ("no quota", "no_quota"),
            (f"A max_running_jobs = {fair['quota']['a_max_running_jobs']}", "quota"),
        ):
            c = fair[key]
            lines.append(
                f"| {label} | {c.get('a_offered', 0)} / {c.get('a_accepted', 0)} | "
                f"{c.get('a_refused_429', 0)} | {c.get('b_succeeded', 0)} | "
                f"{_f(c['b_wait_ms_p50'] / 1000, 2)} / {_f(c['b_wait_ms_p99'] / 1000, 2)} / "
                f"{_f(c['b_wait_ms_max'] / 1000, 2)} s | "
                f"{_f(c['a_wait_ms_p50_of_started'] / 1000, 2)} s |"
            )
    return lines


def _tenant_rows(t: dict) -> list[tuple[str, dict]]:
    """(tenant, its figures) from the scenario's `tenants` (or `per_tenant`): a mapping by
    name, or a list of records naming themselves."""
    per_tenant = t.get("tenants", t.get("per_tenant")) or {}
    if isinstance(per_tenant, dict):
        return [(str(name), fig) for name, fig in per_tenant.items() if isinstance(fig, dict)]
    return [
        (str(fig.get("tenant", fig.get("name", i + 1))), fig)
        for i, fig in enumerate(per_tenant)
        if isinstance(fig, dict)
    ]


def _ms(fig: dict, key: str) -> str:
    value = fig.get(key)
    return f"{_f(value, 0)} ms" if isinstance(value, int | float) else "–"


def _tenants_section(t: dict) -> list[str]:
    """The `tenants` scenario: Jain's index over the backlogged tenants, each tenant's and
    each plan's wait. Every figure is optional: a missing one shows as –."""
    lines = ["", "## Fairness between tenants (issue 27)", ""]
    jain = t.get("jain_index")
    if isinstance(jain, int | float):
        lines += [
            f"Jain's index over the backlogged tenants, each one's served work over its plan's "
            f"weight: **{jain:.3f}** (1 = every tenant served in proportion to its weight, "
            "1/n = one tenant served alone; target ≥ 0.9).",
            "",
        ]
    rows = _tenant_rows(t)
    if rows:
        lines += ["| tenant | plan | jobs | wait p50 | wait p99 |", "|---|---|---:|---:|---:|"]
        for name, fig in rows:
            jobs = fig.get("jobs")
            lines.append(
                f"| {name} | {fig.get('plan', '–')} | "
                f"{f'{jobs:,}' if isinstance(jobs, int) else '–'} | "
                f"{_ms(fig, 'wait_p50_ms')} | {_ms(fig, 'wait_p99_ms')} |"
            )
    eta = t.get("position_eta")
    if isinstance(eta, dict) and isinstance(eta.get("all"), dict):
        lines += [
            "",
            "Position/ETA: a queued job's predicted start (GET /api/v1/jobs/<id> right after "
            "its POST) against its real start, absolute error:",
            "",
            "| jobs read back | error p50 | error p90 |",
            "|---|---:|---:|",
        ]
        for name, key in (
            ("all", "all"),
            ("the flooding tenant's", "flooding_tenant"),
            ("the quiet tenants'", "quiet_tenants"),
        ):
            fig = eta.get(key) or {}
            jobs = fig.get("jobs")
            lines.append(
                f"| {name} ({jobs if isinstance(jobs, int) else '–'}) | "
                f"{_ms(fig, 'error_p50_ms')} | {_ms(fig, 'error_p90_ms')} |"
            )
    plans = t.get("plans")
    if not isinstance(plans, dict):
        # Percentiles do not add up across tenants: per plan, the jobs and the range of its
        # tenants' figures.
        plans = {}
        for _, fig in rows:
            plans.setdefault(fig.get("plan", "–"), []).append(fig)
        plans = {
            plan: {
                "jobs": sum(f["jobs"] for f in figs if isinstance(f.get("jobs"), int)),
                "wait_p50_ms": _range(figs, "wait_p50_ms"),
                "wait_p99_ms": _range(figs, "wait_p99_ms"),
            }
            for plan, figs in plans.items()
        }
    if plans:
        lines += ["", "| plan | jobs | wait p50 | wait p99 |", "|---|---:|---:|---:|"]
        for plan, fig in plans.items():
            if not isinstance(fig, dict):
                continue
            cells = [
                fig[key] if isinstance(fig.get(key), str) else _ms(fig, key)
                for key in ("wait_p50_ms", "wait_p99_ms")
            ]
            jobs = fig.get("jobs")
            lines.append(
                f"| {plan} | {f'{jobs:,}' if isinstance(jobs, int) else '–'} | "
                f"{cells[0]} | {cells[1]} |"
            )
    return lines


def _range(figs: list[dict], key: str) -> str:
    """The lowest to highest of the tenants' `key`, as a table cell."""
    values = [f[key] for f in figs if isinstance(f.get(key), int | float)]
    if not values:
        return "–"
    low, high = min(values), max(values)
    return f"{_f(low, 0)} ms" if low == high else f"{_f(low, 0)}–{_f(high, 0)} ms (tenants)"


def _settings_section(r: dict) -> list[str]:
    lines = [
        "",
        "## Latency vs throughput (open loop, 150 jobs/s offered over REST)",
        "",
        "| batch_size | batch_timeout | jobs/s | p50 ms | p95 ms | p99 ms | batch sizes |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in r["settings"]:
        lines.append(
            f"| {s['batch_size']} | {s['batch_timeout']} | {s['throughput_jobs_s']:.1f} | "
            f"{s['p50_ms']:.0f} | {s['p95_ms']:.0f} | {s['p99_ms']:.0f} | {s['batch_hist']} |"
        )
    return lines + [
        "",
        "![latency vs throughput](latency_vs_throughput.png)",
        "![batch sizes](batch_sizes.png)",
    ]


def _padding_section(pad: dict) -> list[str]:
    return [
        "",
        "## Padding saved by length bucketing (mixed lengths, windows of 32)",
        "",
        "| useful tokens | computed, one padded batch | computed, bucketed | padding saved | "
        "time one batch | time bucketed |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {pad['useful_tokens']} | {pad['computed_one_padded_batch']} | "
        f"{pad['computed_bucketed']} | {pad['padding_saved_pct']:.0f} % | "
        f"{pad['seconds_one_padded_batch']:.2f} s | {pad['seconds_bucketed']:.2f} s |",
    ]


def plot(r: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "settings" in r:
        fig, ax = plt.subplots(figsize=(6, 4))
        for s in r["settings"]:
            label = f"bs={s['batch_size']}, t={s['batch_timeout']}"
            ax.plot(
                [s["throughput_jobs_s"]] * 3,
                [s["p50_ms"], s["p95_ms"], s["p99_ms"]],
                "o-",
                label=label,
            )
        ax.set_xlabel("throughput (jobs/s)")
        ax.set_ylabel("latency p50 / p95 / p99 (ms)")
        ax.set_yscale("log")
        ax.legend()
        ax.set_title("renq e2e latency vs throughput (150 jobs/s offered)")
        fig.tight_layout()
        fig.savefig(out / "latency_vs_throughput.png", dpi=100)
        plt.close(fig)

        fig, axes = plt.subplots(1, len(r["settings"]), figsize=(12, 3), sharey=False)
        for ax, s in zip(axes, r["settings"], strict=True):
            hist = {int(k): v for k, v in s["batch_hist"].items()}
            ax.bar(list(hist), list(hist.values()))
            ax.set_title(f"bs={s['batch_size']}, t={s['batch_timeout']}")
            ax.set_xlabel("batch size")
        axes[0].set_ylabel("jobs")
        fig.tight_layout()
        fig.savefig(out / "batch_sizes.png", dpi=100)
        plt.close(fig)

    if "noop" in r:
        roles = ("web", "postgres", "rabbitmq", "worker", "redis")
        cases = (("1 job / POST", r["noop"]["single"]), ("100 jobs / POST", r["noop"]["batched"]))
        fig, ax = plt.subplots(figsize=(6, 4))
        bottom = [0.0, 0.0]
        for role in roles:
            values = [c["cpu_ms_per_job_by_role"][role] for _, c in cases]
            ax.bar([name for name, _ in cases], values, bottom=bottom, label=role)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.axhline(4, color="black", ls=":", lw=1, label="target 4 ms")
        ax.set_ylabel("CPU ms per no-op job")
        ax.set_title("the stack's CPU per job, by process")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "noop_cpu.png", dpi=100)
        plt.close(fig)

    if "priority" in r:
        from bench.priority import plot as plot_priority

        plot_priority(r["priority"], out / "priority_waits.png")
