"""Bundles for ``render``: from an incident store, or from a findings file.

The shell side of the report (report/README.md "Where the data comes from"):
- ``--store URL``: the store's jobs, incidents and per-window rows.
- ``--findings F``: the store next to F when there is one
  (``artemis.store.open_for_findings``); else ``incidents.jsonl`` next to F, with
  the subject's per-window series rebuilt from F's own finding lines
  (``rows_from_findings``, pure) and the plans file for the actions' numbers. Peer
  bands and the job's throughput per window exist only in a store; the page says so.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from artemis.common.diskio import rotated_paths
from artemis.store import Store, StoreError, open_for_findings, open_store

from .html import anchor, render


class ReportError(Exception):
    """Bad input for a report; the message names the file, job or incident."""


def report_name(job: str, incident: str | None = None) -> str:
    """The file name of a job's report (one per job; a single incident's has its id too)."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", job).strip("._") or "job"
    if incident is not None:
        base += "--" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", incident).strip("._") or "incident")
    return base + ".html"


def report_path(out_dir: str | Path, job: str, incident: str | None = None) -> Path:
    """Where ``write_job_report`` puts a job's report (for annotations and logs)."""
    return Path(out_dir) / report_name(job, incident)


def incident_link(out_dir: str | Path, job: str, incident: str) -> str:
    """The report's path with the incident's anchor: what an annotation or alert can
    carry to point at one incident (``<dir>/<job>.html#incident-<id>``)."""
    return f"{report_path(out_dir, job)}#incident-{anchor(incident)}"


def _matches(finding: Mapping[str, Any], inc: Mapping[str, Any]) -> bool:
    if finding.get("job", inc.get("job")) != inc.get("job"):
        return False
    if finding.get("kind") != inc.get("kind"):
        return False
    if inc.get("rank") is not None:
        return bool(finding.get("rank") == inc.get("rank"))
    if inc.get("ranks"):
        return sorted(finding.get("ranks") or []) == sorted(inc["ranks"])
    return str(finding.get("island")) == str(inc.get("island"))


def rows_from_findings(
    findings: Iterable[Mapping[str, Any]], incidents: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Job rows (step time only) and subject rows rebuilt from finding lines. Pure.

    A finding line carries its subject's ratio and gaps, and its step time as
    excess / loss; the peers' spread and the job's throughput per window are not
    in it (the store has them)."""
    step: dict[tuple[str, int], float] = {}
    subjects: dict[str, dict[int, dict[str, Any]]] = {str(i["id"]): {} for i in incidents}
    for f in findings:
        w = f.get("window")
        if not isinstance(w, int) or f.get("state") not in ("suspect", "flagged", "ongoing"):
            continue
        ex, loss = f.get("excess_ms"), f.get("loss_pct")
        if isinstance(ex, (int, float)) and isinstance(loss, (int, float)) and loss > 0:
            step.setdefault((str(f.get("job")), w), 100.0 * ex / loss)
        ev = f.get("evidence") or {}
        for inc in incidents:
            lo = min(
                [m.get("window", w) for m in inc.get("markers") or [] if m.get("marker") == "onset"]
                or [(inc.get("opened") or {}).get("window", w)]
            )
            hi = (inc.get("closed") or {}).get("window")
            if w < lo or (hi is not None and w > hi) or not _matches(f, inc):
                continue
            subjects[str(inc["id"])][w] = {
                "incident": inc["id"],
                "window": w,
                "ratio": f.get("ratio"),
                "gap_ms": ev.get("gap_ms"),
                "peers_gap_ms": ev.get("peers_gap_ms"),
            }
    job_rows = [{"job": j, "window": w, "step_ms": v} for (j, w), v in sorted(step.items())]
    return job_rows, {k: [v[w] for w in sorted(v)] for k, v in subjects.items()}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The file's lines as objects, its rotated generations (``NAME.N`` .. ``NAME.1``,
    the coordinator's retention) first, oldest first."""
    try:
        text = "".join(q.read_text(encoding="utf-8") for q in rotated_paths(path) or [path])
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read: {e}") from e
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _plan_actions(
    plans: Sequence[Mapping[str, Any]], inc: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """An incident's actions from plan lines, for a record that has none of its own."""
    by_id: dict[str, dict[str, Any]] = {}
    opened = (inc.get("opened") or {}).get("window", -1)
    closed = (inc.get("closed") or {}).get("window")
    for p in plans:
        if p.get("job", inc.get("job")) != inc.get("job") or p.get("rank") != inc.get("rank"):
            continue
        w = p.get("window")
        if not isinstance(w, int) or w < opened or (closed is not None and w > closed):
            continue
        a = by_id.setdefault(str(p.get("id")), {"plan": p.get("id"), "history": []})
        a["status"] = p.get("status")
        a["history"].append({"status": p.get("status"), "window": w})
        for k in ("throughput_before", "throughput_after"):
            if p.get(k) is not None:
                a[k] = p[k]
        b, af = a.get("throughput_before"), a.get("throughput_after")
        if isinstance(b, (int, float)) and isinstance(af, (int, float)) and b > 0:
            a["gain_pct"] = round(100.0 * (af - b) / b, 2)
    return list(by_id.values())


def bundle_from_store(
    store: Store,
    job: str,
    *,
    incident: str | None = None,
    generated: float | None = None,
    source: str | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """One job's bundle from a store (raises ReportError for an unknown job or incident)."""
    try:
        jobs = {str(j.get("job")): j for j in store.jobs()}
        incs = store.incidents(job=job)
    except StoreError as e:
        raise ReportError(str(e)) from e
    if job not in jobs and not incs:
        known = ", ".join(sorted(jobs)) or "none"
        raise ReportError(f"job {job!r} is not in {store.url} (jobs there: {known})")
    notes = list(notes)
    run = (jobs.get(job) or {}).get("run")
    if incident is not None:
        incs = [i for i in incs if i.get("id") == incident]
        if not incs:
            raise ReportError(f"incident {incident!r} of job {job!r} is not in {store.url}")
        run = incs[0].get("run") or run
    elif run is not None:
        # A reused job id: the page is its latest run's (the rows are kept per run).
        older = [i for i in incs if i.get("run") not in (None, run)]
        if older:
            incs = [i for i in incs if i.get("run") in (None, run)]
            notes.append(
                f"{len(older)} incident(s) of earlier runs of this job are not on this page; "
                "artemis report --incident ID draws any one of them with its run's windows."
            )
    try:
        rows = store.job_windows(job, run=run) if run is not None else []
        if not rows and run == (jobs.get(job) or {}).get("run"):
            rows = store.job_windows(job)  # the latest run's, rows written without a run
        subjects = {str(i["id"]): store.incident_windows(str(i["id"])) for i in incs}
    except StoreError as e:
        raise ReportError(str(e)) from e
    return {
        "job": dict(jobs.get(job) or {"job": job}),
        "incidents": incs,
        "windows": rows,
        "subjects": subjects,
        "source": source or store.url,
        "generated": generated,
        "notes": notes,
    }


def _jobs_of(store: Store, job: str | None, incident: str | None) -> list[str]:
    try:
        if incident is not None:
            rec = store.incident(incident)
            if rec is None:
                raise ReportError(f"incident {incident!r} is not in {store.url}")
            if job is not None and rec.get("job") != job:
                raise ReportError(
                    f"incident {incident!r} belongs to job {rec.get('job')!r}, not {job!r}"
                )
            return [str(rec.get("job"))]
        if job is not None:
            return [job]
        names = [str(j.get("job")) for j in store.jobs()]
    except StoreError as e:
        raise ReportError(str(e)) from e
    if not names:
        raise ReportError(f"{store.url} has no jobs")
    return names


def bundles_from_store(
    url: str, job: str | None = None, incident: str | None = None, generated: float | None = None
) -> list[dict[str, Any]]:
    """``--store URL``: a bundle per job (or the one job, or the one incident's job)."""
    try:
        store = open_store(url, readonly=True)
    except StoreError as e:
        raise ReportError(str(e)) from e
    try:
        return [
            bundle_from_store(store, j, incident=incident, generated=generated)
            for j in _jobs_of(store, job, incident)
        ]
    finally:
        store.close()


def bundles_from_findings(
    findings: Path,
    plans: Path | None = None,
    job: str | None = None,
    incident: str | None = None,
    generated: float | None = None,
) -> list[dict[str, Any]]:
    """``--findings F [--plans P]``: the store next to F, else its incidents.jsonl with F's lines."""
    if not findings.is_file():
        raise ReportError(f"{findings}: no such findings file")
    if plans is not None and not plans.is_file():
        raise ReportError(f"{plans}: no such plans file")
    try:
        store = open_for_findings(findings)
    except StoreError as e:
        raise ReportError(str(e)) from e
    try:
        names = _jobs_of(store, job, incident)
        has_rows = any(store.job_windows(n) for n in names)
        out = []
        if has_rows:
            for n in names:
                out.append(bundle_from_store(store, n, incident=incident, generated=generated))
            return out
        lines = _read_jsonl(findings)
        plan_lines = _read_jsonl(plans) if plans is not None else []
        for n in names:
            b = bundle_from_store(
                store,
                n,
                incident=incident,
                generated=generated,
                source=f"{store.url} and {findings}",
                notes=[
                    "Made from the incident records and the findings file: the peers' bands and "
                    "the job's useful throughput per window are kept only in the store "
                    "(coordinator setting store), so the plots show the subject's own series "
                    "and the step time of the windows that had a finding."
                ],
            )
            job_rows, subjects = rows_from_findings(
                (f for f in lines if f.get("job", n) == n), b["incidents"]
            )
            b["windows"], b["subjects"] = job_rows, subjects
            for inc in b["incidents"]:
                if not inc.get("actions") and plan_lines:
                    inc["actions"] = _plan_actions(plan_lines, inc)
            out.append(b)
        return out
    except StoreError as e:
        raise ReportError(str(e)) from e
    finally:
        store.close()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        # mkstemp makes it 0600; a report is for others to open (a file share).
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bundle(
    bundle: Mapping[str, Any],
    out_dir: str | Path,
    incident: str | None = None,
    job: str | None = None,
) -> Path:
    """Render a bundle into ``out_dir`` (atomically replaced); its path."""
    job = job or str((bundle.get("job") or {}).get("job") or "job")
    path = report_path(out_dir, job, incident)
    _write_atomic(path, render(bundle))
    return path


def write_job_report(
    store_or_bundle: Store | Mapping[str, Any],
    job: str,
    out_dir: str | Path,
    generated: float | None = None,
) -> Path:
    """A job's report into ``out_dir`` (atomically replaced); its path. For the
    coordinator at a job's end (``report_dir``) and for ``artemis report``."""
    if isinstance(store_or_bundle, Mapping):
        return write_bundle(store_or_bundle, out_dir, job=job)
    return write_bundle(
        bundle_from_store(store_or_bundle, job, generated=generated), out_dir, job=job
    )
