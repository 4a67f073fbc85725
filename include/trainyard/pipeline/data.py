"""Stage 2, the data: the dataset pinned to a commit (a built-in source ingested first), held to the job by
every later task, validated by the recipe's expectation suites, and split into the recipe's records
(cached by commit and split settings).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard import paths
from trainyard.errors import PermanentError
from trainyard.pipeline.records import PinnedDataset, PreparedData, from_xcom, run_dir
from trainyard.spec import JobSpec

if TYPE_CHECKING:
    from trainyard.recipes.base import Recipe

log = logging.getLogger(__name__)


class DataValidationError(PermanentError):
    """The dataset failed its expectation suite; the message lists every failed expectation."""


def _store(kind: str):
    from trainyard.data.stores import open_store

    return open_store(kind)


def resolve_dataset(spec: JobSpec) -> PinnedDataset:
    """Ingest the built-in source if the spec names one, then pin the ref to an immutable commit id."""
    from trainyard.data.store import tree_digest
    from trainyard.datasets import check_job_access

    ds = spec.dataset
    store = _store(ds.store)
    check_job_access(store, spec)
    if ds.source != "none":
        commit = _data_recipe(spec).ingest(ds.source, store, ds.repo, branch="main")
        log.info("ingested built-in source %s into %s: commit %s", ds.source, ds.repo, commit.id)
    commit_id = store.resolve(ds.repo, ds.ref)
    entries = store.list(ds.repo, commit_id)
    digest, files = tree_digest(entries), len(entries)
    log.info("dataset %s@%s pinned to commit %s (%d files, digest %s)", ds.repo, ds.ref, commit_id, files, digest[:12])
    return PinnedDataset(store=store.kind, repo=ds.repo, ref=ds.ref, commit=commit_id, digest=digest, files=files)


def pinned_dataset(spec: JobSpec, dataset: Mapping[str, Any] | PinnedDataset) -> PinnedDataset:
    """A later task's copy of ``resolve_dataset``'s result (an XCom, which a user may write), held to the
    job: a pinned dataset, of the store and repository its spec names, at a commit id (not a branch), in a
    repository its team may read. NotAllowed naming what differs."""
    from trainyard.data.store import COMMIT_RE
    from trainyard.datasets import check_read
    from trainyard.teams import NotAllowed

    ds = spec.dataset
    pinned = from_xcom(PinnedDataset, dataset, "resolve_dataset")
    if (pinned.store, pinned.repo) != (ds.store, ds.repo) or not COMMIT_RE.fullmatch(pinned.commit):
        raise NotAllowed(
            f"the dataset this task was handed ({pinned.store}:{pinned.repo}@{pinned.commit[:64]}) is not the "
            f"job's ({ds.store}:{ds.repo} at a commit id): resolve_dataset's result was changed; trigger the "
            "job again"
        )
    check_read(_store(ds.store), ds.repo, [spec.resources.team], admin=False)
    return pinned


def checkout(dataset: PinnedDataset) -> Path:
    """The commit's files on local disk (immutable, so cached by commit id)."""
    dest = paths.cache_root() / "checkouts" / dataset.repo / dataset.commit
    return _store(dataset.store).export(dataset.repo, dataset.commit, dest)


def _data_recipe(spec: JobSpec) -> Recipe:
    """The recipe whose data layout the job uses; a custom command gets the image-classification one."""
    from trainyard import recipes

    return recipes.get("digits_cnn" if spec.recipe == "custom" else spec.recipe)


def validate_data(spec: JobSpec, dataset: PinnedDataset, run_key: str) -> dict:
    """The recipe's expectation suites over the pinned commit; Data Docs kept with the run."""
    report = _data_recipe(spec).validate(checkout(dataset), run_dir(spec, run_key) / "data_docs")
    out = run_dir(spec, run_key) / "validation.json"
    out.write_text(json.dumps(report.to_dict(), indent=1, default=str))
    log.info("%s (report: %s, data docs: %s)", report.summary(), out, report.docs)
    if not report.success:
        raise DataValidationError(
            f"dataset {dataset.repo}@{dataset.commit[:12]} failed validation, training skipped.\n{report.summary()}"
        )
    return {"success": True, "report": str(out), "docs": report.docs, "checks": len(report.checks)}


def prepare_data(spec: JobSpec, dataset: PinnedDataset) -> PreparedData:
    """Hash split of the commit, written as the recipe's records in LMDB or TFRecord (cached)."""
    from trainyard.data.prepare import prepare_records

    split = spec.split
    recipe = _data_recipe(spec)
    options = recipe.opts(spec)  # a custom job has none (validate_spec): the data recipe's defaults
    manifest = prepare_records(
        lambda: recipe.samples(checkout(dataset), options),
        dataset.commit,
        paths.cache_root() / "prepared",
        split.val_fraction,
        split.seed,
        fmt=spec.dataset.format,
        test_fraction=split.test_fraction,
        variant=recipe.variant(options),
    )
    log.info("prepared %s (%s): %s", manifest.path, "cache hit" if manifest.cached else "built", manifest.counts)
    return manifest
