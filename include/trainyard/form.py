"""The trigger form: a typed input per JobSpec field, and a run's conf read back as the JobSpec's input.

Airflow's trigger form draws one input per DAG Param from its JSON schema: a number box with its bounds for
a number, a dropdown for an enum, a switch for a boolean, a box of lines for a list of strings, and a JSON
editor for an object or a list of objects. So each JobSpec field is a Param of its own, named by its path in
the spec (``hyperparameters.epochs``: the name the spec's own errors use), in one of the form's sections
(:data:`LAYOUT`); the form sends one key per field. REST clients, ``trainyard submit`` and the retraining
jobs send whole sections as objects; :func:`spec_input` reads either shape, or both mixed, into the one dict
the JobSpec validates. Everything here comes from the JobSpec's models and resources.yaml: a new field is in
the form without a line written here (:func:`form_fields` places it in its section's place).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainyard.errors import PermanentError

if TYPE_CHECKING:
    from trainyard.scheduling.resources import ResourcesConfig
    from trainyard.spec import JobSpec

# The form's sections in order, each with the JobSpec fields it shows: a section's name (``dataset``) stands
# for every field of it not shown before. The first, None, is Airflow's own first section ("Run
# Parameters"), the only one open when the form opens: what every job sets. The others open on a click.
LAYOUT: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (
        None,
        (
            "name",
            "recipe",
            "resources.team",
            "resources.gpu_type",
            "resources.gpus_per_node",
            "resources.max_hours",
        ),
    ),
    ("Data", ("dataset", "split")),
    ("Training", ("hyperparameters", "recipe_options", "gates", "champion")),
    ("Resources", ("resources", "distributed", "checkpointing")),
    ("Tracking, export and backends", ("tracking", "export", "backends")),
    ("Sweep", ("sweep",)),
    ("Custom program", ("custom",)),
    ("Kubernetes", ("kubernetes",)),
    ("Replay", ("replay_of", "replay_exact")),
)


@dataclass(frozen=True)
class FormField:
    """One input of the form: what the Param is made of."""

    default: Any
    description: str
    schema: dict[str, Any]  # validation keywords, with the form's title, section and values_display


class ConfError(PermanentError, ValueError):
    """A run's conf that cannot be read as one JobSpec: a field given twice with two values."""


@functools.cache
def _properties() -> dict[str, dict[str, Any]]:
    """The JobSpec's top-level fields as JSON schemas standing alone: references inlined (the field's own
    keys win over its model's), ``X | None`` as ``type: [x, "null"]`` (what the form draws as optional)."""
    from trainyard.spec import JobSpec

    schema = JobSpec.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(v) for v in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return {
                **inline(defs[node["$ref"].rsplit("/", 1)[-1]]),
                **inline({k: v for k, v in node.items() if k != "$ref"}),
            }
        node = {k: inline(v) for k, v in node.items()}
        options = node.get("anyOf", [])
        if len(options) == 2 and {"type": "null"} in options:
            other = next(o for o in options if o != {"type": "null"})
            if isinstance(other.get("type"), str):
                node = {**other, **{k: v for k, v in node.items() if k != "anyOf"}, "type": [other["type"], "null"]}
        return node

    return {name: inline(prop) for name, prop in schema["properties"].items()}


def _lean(node: Any) -> Any:
    """Validation keywords only (no titles, defaults or descriptions, at every depth): Airflow stores a
    Param's schema with the DAG and prints it whole in a refusal."""
    if isinstance(node, list):
        return [_lean(v) for v in node]
    if not isinstance(node, dict):
        return node
    return {
        k: ({f: _lean(s) for f, s in v.items()} if k == "properties" else _lean(v))
        for k, v in node.items()
        if k not in ("title", "default", "description")
    }


def _is_section(prop: dict[str, Any]) -> bool:
    return bool(prop.get("properties"))


@functools.cache
def optional_sections() -> frozenset[str]:
    """The sections a job may leave out altogether (``sweep``, ``custom``): their default is null."""
    return frozenset(
        name for name, prop in _properties().items() if _is_section(prop) and "null" in _types(prop.get("type"))
    )


def _types(kind: Any) -> list[str]:
    return kind if isinstance(kind, list) else [kind] if kind else []


def field_paths() -> list[str]:
    """Every input's name: a section's fields as ``section.field``, any other top-level field by its name."""
    return [
        f"{name}.{sub}" if _is_section(prop) else name
        for name, prop in _properties().items()
        for sub in (prop["properties"] if _is_section(prop) else [None])
    ]


_CAPITALS = {"gpu": "GPU", "gpus": "GPUs", "mb": "MB", "pvc": "PVC", "onnx": "ONNX"}


def _words(path: str) -> str:
    """An input's label: its field's name in words (``gpus_per_node``: "GPUs per node")."""
    words = [_CAPITALS.get(w, w) for w in path.rsplit(".", 1)[-1].split("_")]
    return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])


def form_fields(
    defaults: Mapping[str, Any], config: ResourcesConfig | None = None, team: str | None = None
) -> dict[str, FormField]:
    """The form's inputs in :data:`LAYOUT`'s order, by name: each with the JobSpec's default (``defaults``:
    a JobSpec dumped as JSON), its description, and its schema (type, bounds, choices). ``config``: the GPU
    types and teams to choose from, each type with its price; none (a broken resources.yaml) leaves them
    free text, which admission checks. ``team``: a team's own DAG, whose team is fixed and not shown.
    A new field takes its section's place; a new top-level field not in the layout comes last."""
    props = _properties()
    sections = {entry: section for section, entries in LAYOUT for entry in entries}
    rank = {entry: i for i, entry in enumerate(sections)}
    placed: dict[str, FormField] = {}
    for path in sorted(field_paths(), key=lambda p: rank.get(p, rank.get(p.partition(".")[0], len(rank)))):
        top, _, sub = path.partition(".")
        node = props[top]["properties"][sub] if sub else props[top]
        section = sections.get(path, sections.get(top))
        placed[path] = _field(path, node, defaults, section)
    _choices(placed, defaults, config, team)
    return {  # the name the spec's errors use, to find the input they mean
        path: FormField(f.default, f"{f.description} ({path})".lstrip(), f.schema) for path, f in placed.items()
    }


def _field(path: str, node: dict[str, Any], defaults: Mapping[str, Any], section: str | None) -> FormField:
    top, _, sub = path.partition(".")
    schema = _lean(node)
    description = node.get("description", "")
    if sub and top in optional_sections():  # empty unless the job uses the section: every input may be null
        default = None
        schema["type"] = [*dict.fromkeys([*_types(schema.get("type")), "null"])]
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
            if "default" in node:
                schema["values_display"] = {"null": f"(default: {node['default']})"}
        shown = f"default {json.dumps(node['default'])}" if "default" in node else "required"
        description = f"{description} ({shown} when the {top} section is used; all empty: no {top})"
    else:
        default = defaults[top][sub] if sub else defaults[top]
        if "enum" in schema and default is None and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
    schema["title"] = _words(path)
    if section is not None:
        schema["section"] = section
    return FormField(default=default, description=description, schema=schema)


def _priced(config: ResourcesConfig, gpu_type: str) -> str:
    """How the form lists ``gpu_type``: its price per GPU-hour and its GPUs, or for a type partitioned with
    MIG each profile's price per slice-hour and its slices (:attr:`ResourcesConfig.slot_types`)."""
    gpu = config.gpu_types[gpu_type]
    if not gpu.mig_profiles:
        return f"{gpu_type}: ${gpu.price_per_hour:.2f} per GPU-hour, {gpu.slots} in the fleet"
    slices = {
        name.removeprefix(f"{gpu_type}."): slot
        for name, slot in config.slot_types.items()
        if name.startswith(f"{gpu_type}.")
    }
    each = ", ".join(f"{p} ${s.price_per_hour:.2f} per slice-hour ({s.slots})" for p, s in slices.items())
    return f"{gpu_type}: MIG slices, name one in resources.mig_profile: {each}"


def _choices(
    placed: dict[str, FormField], defaults: Mapping[str, Any], config: ResourcesConfig | None, team: str | None
) -> None:
    """``resources.gpu_type`` and ``resources.team`` as choices from resources.yaml, each GPU type with its
    price and the job's worst case at the defaults; a team's own DAG fixes its team (a hidden input)."""
    if team is not None:
        field = placed["resources.team"]
        placed["resources.team"] = FormField(team, field.description, {**field.schema, "const": team})
    if config is None:
        return
    res = defaults["resources"]
    gpus = res["nodes"] * res["gpus_per_node"]
    types = list(config.gpu_types)
    shown = {t: _priced(config, t) for t in types}
    # what a job's slots are priced at: a whole GPU, or on a type partitioned with MIG each profile's slice
    worst = ", ".join(f"{t} ${res['max_hours'] * gpus * g.price_per_hour:,.2f}" for t, g in config.slot_types.items())
    field = placed["resources.gpu_type"]
    placed["resources.gpu_type"] = FormField(
        field.default,
        f"{field.description}. A job's worst-case cost is max hours x GPUs (or MIG slices) x their price; "
        f"admission refuses a job whose worst case is more than its team's budget has left. At "
        f"{res['max_hours']:g} h on {gpus} GPU(s): {worst}",
        {
            **field.schema,
            "enum": [*types, *([field.default] if field.default not in types else [])],
            "values_display": shown,
        },
    )
    if team is None:
        teams = list(config.teams)
        field = placed["resources.team"]
        placed["resources.team"] = FormField(
            field.default,
            field.description,
            {**field.schema, "enum": [*teams, *([field.default] if field.default not in teams else [])]},
        )


def spec_input(conf: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's conf as the JobSpec's input: sections as objects (``{"hyperparameters": {"epochs": 3}}``,
    what REST clients send) and fields by path (``{"hyperparameters.epochs": 3}``, what the trigger form
    sends), or both. An optional section (``sweep``) given by path only with every field empty is left out;
    its empty fields are dropped. A field given both ways with two values is refused (ConfError): which
    one the user meant cannot be known; so is a conf that is not an object, and a path below a field
    (``kubernetes.env.FOO``: ``kubernetes.env`` is given whole). Anything else is left for the JobSpec to
    accept or refuse by name."""
    if not isinstance(conf, Mapping):
        raise ConfError(f"a run's conf is a JSON object of JobSpec fields, not a {type(conf).__name__}")
    out: dict[str, Any] = {}
    by_path: dict[str, dict[str, Any]] = {}
    for key, value in conf.items():
        top, dot, sub = str(key).partition(".")
        if dot and "." in sub:
            field = f"{top}.{sub.partition('.')[0]}"
            raise ConfError(f"{key}: a field's path is section.field; give {field} whole, as an object or a list")
        if dot and sub:
            by_path.setdefault(top, {})[sub] = value
        else:
            out[key] = value
    for top, fields in by_path.items():
        if top in optional_sections():
            fields = {k: v for k, v in fields.items() if v is not None}
            if not fields:
                continue
        given = out.get(top)
        if not isinstance(given, Mapping):
            if given is not None:
                raise ConfError(
                    f"{top} is given both as {given!r} and field by field ({', '.join(fields)}): give it one way"
                )
            out[top] = fields
            continue
        clash = [k for k, v in fields.items() if k in given and given[k] != v]
        if clash:
            raise ConfError(
                "; ".join(
                    f"{top}.{k} is given twice: {given[k]!r} in {top} and {fields[k]!r} as {top}.{k}" for k in clash
                )
                + ": give each field once"
            )
        out[top] = {**given, **fields}
    return out


def run_input(conf: Mapping[str, Any] | None, team: str | None) -> dict[str, Any]:
    """The JobSpec's input for a run of a training DAG: the JobSpec's defaults (in a team's own DAG, with
    its team) overlaid with the run's conf (:func:`spec_input`); in a team's own DAG, ``resources`` without
    a team are that team's. Unknown keys stay, so the JobSpec can refuse them by name."""
    from trainyard.spec import JobSpec

    defaults = JobSpec.model_validate({"resources": {"team": team}} if team else {}).model_dump(mode="json")
    raw = {**defaults, **spec_input(conf or {})}
    if team and isinstance(raw.get("resources"), dict) and "team" not in raw["resources"]:
        raw["resources"] = {**raw["resources"], "team": team}
    return raw


def run_spec(dag_id: str, conf: Mapping[str, Any] | None) -> JobSpec | None:
    """The JobSpec a run of the training DAG ``dag_id`` with ``conf`` trains (:func:`run_input`), or None for
    a conf the JobSpec refuses: its first task says why."""
    from pydantic import ValidationError

    from trainyard.spec import JobSpec
    from trainyard.teams import team_of_dag

    try:
        return JobSpec.model_validate(run_input(conf, team_of_dag(dag_id)))
    except (ConfError, ValidationError):
        return None


def run_note(dag_id: str, conf: Mapping[str, Any] | None) -> str | None:
    """What a run of the training DAG ``dag_id`` is, in a line for its note (the JobSpec's headline: job,
    recipe, GPUs, team), or None for a conf the JobSpec refuses."""
    spec = run_spec(dag_id, conf)
    return None if spec is None else spec.headline()
