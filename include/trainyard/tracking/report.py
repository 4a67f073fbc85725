"""A run's report, stored with it once its gate has decided: ``report/curves.png`` (its training curves)
and ``report/report.html`` (one page: metrics, the gate table, dataset commit, code version, cost, the
queue wait), as MLflow artifacts of its run and in its run directory."""

from __future__ import annotations

import html
import time
from pathlib import Path

CURVES = ("train_loss", "train_lr", "samples_per_second")  # then every val_* metric the run has


def curve_names(c, run_id: str) -> list[str]:
    metrics = c.get_run(run_id).data.metrics
    return [m for m in CURVES if m in metrics] + sorted(m for m in metrics if m.startswith("val_"))


def _rows(pairs) -> str:
    return "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in pairs)


def _value(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def write(c, run_id: str, out_dir: str | Path, gate: dict | None = None) -> dict[str, Path]:
    """The report of MLflow run ``run_id`` into ``out_dir`` and onto the run; the files' paths."""
    from trainyard.tracking.runs import Run, curves_png

    run = c.get_run(run_id)
    out = Path(out_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    info = Run.of(run, c.get_experiment(run.info.experiment_id).name)
    names = curve_names(c, run_id)
    png = curves_png(c, [info], names or ["train_loss"], out / "curves.png")
    tags, metrics = info.tags, info.metrics
    facts = [
        ("job", info.experiment),
        ("run", tags.get("trainyard.run_key", info.name)),
        ("MLflow run", run_id),
        ("started", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.start))),
        ("dataset", f"{tags.get('dataset.repo', '-')} @ {tags.get('dataset.commit', '-')}"),
        ("code version", tags.get("code_version", "-")),
        ("triggered by", tags.get("triggered_by", "-")),
        ("GPU-seconds", _value(metrics.get("gpu_seconds", "-"))),
        ("cost", _value(metrics.get("run_cost", "-"))),
        ("queue wait (s)", _value(metrics.get("queue_wait_seconds", "-"))),
    ]
    if "sweep.name" in tags:
        facts.append(("sweep", f"{tags['sweep.name']}, trial {tags.get('sweep.trial', '-')}"))
    gate_rows = ""
    if gate is not None:
        for row in gate.get("checks", []):
            bound = ", ".join(f"{k} {row[k]:.6g}" for k in ("min", "max") if row.get(k) is not None)
            verdict = "pass" if row["passed"] else "FAIL"
            value = "missing" if row.get("value") is None else f"{row['value']:.6g}"
            gate_rows += (
                f"<tr class={verdict.lower()}><td>{html.escape(row['kind'])}</td><td>{html.escape(row['metric'])}</td>"
                f"<td>{value}</td><td>{html.escape(bound)}</td><td>{verdict}</td></tr>"
            )
    verdict = "" if gate is None else ("passed" if gate["passed"] else "FAILED")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(info.experiment)}: {html.escape(info.name)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}table{{border-collapse:collapse;margin:1em 0}}
th,td{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}tr.fail td{{background:#fdd}}</style></head>
<body><h1>{html.escape(info.experiment)} <small>{html.escape(info.name)}</small></h1>
<table>{_rows(facts)}</table>
<h2>Gate {verdict}</h2>
<table><tr><th>kind</th><th>metric</th><th>value</th><th>bound</th><th>verdict</th></tr>{gate_rows}</table>
<h2>Metrics</h2><table>{_rows((k, _value(v)) for k, v in sorted(metrics.items()))}</table>
<h2>Parameters</h2><table>{_rows(sorted(info.params.items()))}</table>
<h2>Curves</h2><img src="curves.png" alt="training curves" style="max-width:100%">
</body></html>
"""
    page_path = out / "report.html"
    page_path.write_text(page, encoding="utf-8")
    c.log_artifacts(run_id, str(out), "report")
    return {"html": page_path, "png": png}
