"""Data validation with great-expectations 1.x: a suite file per data kind, run on a pandas profile.

The suite files live in include/config/expectations/<kind>.yaml. String values of the form ``${name}``
are replaced by typed values from the dataset's own metadata before the suite is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.scheduling.resources import default_config_dir

if TYPE_CHECKING:
    from great_expectations.checkpoint.actions import ValidationAction
    from great_expectations.data_context import AbstractDataContext


@dataclass
class CheckResult:
    expectation: str
    kwargs: dict
    success: bool
    unexpected_count: int | None = None
    element_count: int | None = None
    sample: list = field(default_factory=list)
    observed: object = None

    def line(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items() if k != "batch_id")
        detail = ""
        if self.unexpected_count is not None:
            detail = f": {self.unexpected_count} of {self.element_count} rows fail"
            if self.sample:
                detail += f", e.g. {self.sample[:5]}"
        elif self.observed is not None:
            detail = f": observed {self.observed}"
        return f"{self.expectation}({args}){detail}"


@dataclass
class ValidationReport:
    suite: str
    success: bool
    checks: list[CheckResult]
    docs: str | None = None  # Data Docs index.html, when built

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.success]

    def summary(self) -> str:
        head = f"suite {self.suite!r}: {len(self.checks) - len(self.failed)}/{len(self.checks)} expectations passed"
        if self.success:
            return head
        return head + "\n" + "\n".join(f"  FAILED {c.line()}" for c in self.failed)

    def to_dict(self) -> dict:
        return {
            "suite": self.suite,
            "success": self.success,
            "checks": [c.__dict__ for c in self.checks],
            "docs": self.docs,
        }


def merge_reports(name: str, *reports: ValidationReport) -> ValidationReport:
    """Several suites over one dataset as one report (every check, passed only if all passed)."""
    return ValidationReport(
        suite=name,
        success=all(r.success for r in reports),
        checks=[c for r in reports for c in r.checks],
        docs=next((r.docs for r in reports if r.docs), None),
    )


def load_suite_config(kind: str, values: dict, config_dir: Path | None = None) -> dict:
    import yaml

    path = (config_dir or default_config_dir()) / "expectations" / f"{kind}.yaml"
    if not path.exists():
        raise ValueError(f"no expectation suite for data kind {kind!r} (looked for {path})")
    raw = yaml.safe_load(path.read_text())

    def subst(obj):
        if isinstance(obj, str) and obj.startswith("${") and obj.endswith("}"):
            name = obj[2:-1]
            if name not in values:
                raise ValueError(f"{path}: placeholder {obj} has no value; known: {sorted(values)}")
            return values[name]
        if isinstance(obj, list):
            return [subst(v) for v in obj]
        if isinstance(obj, dict):
            return {k: subst(v) for k, v in obj.items()}
        return obj

    return subst(raw)


def _replace_dir(new: Path, dest: Path) -> None:
    """Put the finished folder ``new`` at ``dest``, setting aside and removing what was there; if another
    process puts its own there in between, theirs stays (a report of the same data) and ``new`` goes."""
    import contextlib
    import os
    import shutil
    import uuid

    old = dest.with_name(f".{dest.name}-old-{uuid.uuid4().hex}")
    with contextlib.suppress(FileNotFoundError):
        os.rename(dest, old)
    try:
        os.rename(new, dest)
    except OSError:  # another report got there first
        shutil.rmtree(new, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def validate_dataframe(df, suite_config: dict, docs_dir: str | Path | None = None) -> ValidationReport:
    """Run a suite over a dataframe; return every expectation's result.

    With ``docs_dir``, a file-backed GX project is made there and its Data Docs (HTML) are built, so each
    run keeps a browsable report (``report.docs``); without it, an ephemeral context leaves nothing behind.
    The project is built in a fresh folder beside ``docs_dir`` and then put in its place: validating the
    same data again (an identical upload, a retried task), or twice at once, replaces the report whole
    instead of failing on the project the first one left."""
    import tempfile

    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    context: AbstractDataContext
    project = None
    if docs_dir is not None:
        docs_dir = Path(docs_dir)
        docs_dir.parent.mkdir(parents=True, exist_ok=True)
        project = Path(tempfile.mkdtemp(prefix=f".{docs_dir.name}-", dir=docs_dir.parent))
        context = gx.get_context(mode="file", project_root_dir=str(project))
    else:
        context = gx.get_context(mode="ephemeral")
    # GX's per-metric progress bars would flood the Airflow task log.
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch_def = (
        context.data_sources.add_pandas("trainyard")
        .add_dataframe_asset("samples")
        .add_batch_definition_whole_dataframe("all")
    )
    suite = gx.ExpectationSuite(name=suite_config["name"])
    for exp in suite_config["expectations"]:
        suite.add_expectation(ExpectationConfiguration(type=exp["type"], kwargs=exp["kwargs"]).to_domain_obj())
    suite = context.suites.add(suite)
    definition = context.validation_definitions.add(gx.ValidationDefinition(name="check", data=batch_def, suite=suite))
    actions: list[ValidationAction] = (
        [gx.checkpoint.UpdateDataDocsAction(name="data_docs")] if docs_dir is not None else []
    )
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(name="validate", validation_definitions=[definition], actions=actions, result_format="SUMMARY")
    )
    run = checkpoint.run(batch_parameters={"dataframe": df})
    result = next(iter(run.run_results.values()))
    checks = []
    for r in result.results:
        config = r.expectation_config
        assert config is not None  # a checkpoint's results each name the expectation they ran
        res = r.result or {}
        checks.append(
            CheckResult(
                expectation=config.type,
                kwargs={k: v for k, v in config.kwargs.items() if k != "batch_id"},
                success=bool(r.success),
                unexpected_count=res.get("unexpected_count"),
                element_count=res.get("element_count"),
                sample=json.loads(json.dumps(res.get("partial_unexpected_list") or [], default=str)),
                observed=json.loads(json.dumps(res.get("observed_value"), default=str)),
            )
        )
    docs = None
    if docs_dir is not None and project is not None:
        _replace_dir(project, docs_dir)
        index = sorted(docs_dir.glob("gx/uncommitted/data_docs/*/index.html"))
        docs = str(index[0]) if index else None
    return ValidationReport(suite=suite_config["name"], success=bool(result.success), checks=checks, docs=docs)
