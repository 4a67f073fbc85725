"""The trigger form's inputs (one per JobSpec field, typed, in sections) and a conf read back as a JobSpec."""

from __future__ import annotations

import json

import jsonschema
import pytest

from trainyard.form import LAYOUT, ConfError, field_paths, form_fields, optional_sections, spec_input
from trainyard.scheduling.resources import load_resources
from trainyard.spec import JobSpec, SpecError, parse_spec

DEFAULTS = JobSpec().model_dump(mode="json")


@pytest.fixture(scope="module")
def fields():
    return form_fields(DEFAULTS, load_resources(), None)


def _sent_by_the_form(fields, **changed):
    """The conf the trigger form sends: every input's value, by name."""
    return {name: changed.get(name.replace(".", "__"), f.default) for name, f in fields.items()}


def test_every_field_is_one_typed_input_in_its_section(fields):
    assert sorted(fields) == sorted(field_paths())
    laid_out = {entry.partition(".")[0] for _, entries in LAYOUT for entry in entries}
    assert laid_out == set(JobSpec.model_fields)  # a new top-level field is given its place
    assert "$ref" not in json.dumps([f.schema for f in fields.values()])  # a Param's schema stands alone
    for name, f in fields.items():
        assert f.description.endswith(f"({name})") and len(f.description) > len(name) + 3, name
        assert "title" in f.schema and "default" not in f.schema, name
        jsonschema.validate(f.default, f.schema)  # the form opens valid
    first = [name for name, f in fields.items() if "section" not in f.schema]
    assert first == [entry for entry in LAYOUT[0][1]]  # what every job sets, open when the form opens
    epochs = fields["hyperparameters.epochs"]
    assert (epochs.default, epochs.schema["type"], epochs.schema["minimum"], epochs.schema["maximum"]) == (
        10,
        "integer",
        1,
        1000,
    )
    assert epochs.schema["section"] == "Training" and epochs.schema["title"] == "Epochs"
    assert fields["hyperparameters.optimizer"].schema["enum"] == ["sgd", "adamw"]
    assert fields["resources.gpus_per_node"].schema["title"] == "GPUs per node"
    assert fields["checkpointing.every_steps"].schema["type"] == ["integer", "null"]
    assert fields["gates"].schema["type"] == "array" and "properties" in fields["gates"].schema["items"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(0, epochs.schema)


def test_an_optional_section_opens_empty_and_says_its_defaults(fields):
    assert optional_sections() == {"sweep", "custom"}
    sweep = {name: f for name, f in fields.items() if name.startswith("sweep.")}
    assert sweep and all(f.default is None and f.schema["section"] == "Sweep" for f in sweep.values())
    direction = sweep["sweep.direction"]
    assert direction.schema["enum"] == ["maximize", "minimize", None]
    assert direction.schema["values_display"] == {"null": "(default: maximize)"}
    assert 'default "maximize" when the sweep section is used' in direction.description
    assert "required when the sweep section is used" in sweep["sweep.name"].description


def test_gpu_types_and_teams_are_choices_from_the_resources_file_with_prices():
    config = load_resources()
    fields = form_fields(DEFAULTS, config, None)
    gpu_type = fields["resources.gpu_type"]
    assert gpu_type.schema["enum"] == list(config.gpu_types)
    h100 = config.gpu_types["h100-80gb"]
    assert gpu_type.schema["values_display"]["h100-80gb"] == (
        f"h100-80gb: ${h100.price_per_hour:.2f} per GPU-hour, {h100.slots} in the fleet"
    )
    worst = DEFAULTS["resources"]["max_hours"] * DEFAULTS["resources"]["gpus_per_node"] * h100.price_per_hour
    assert f"h100-80gb ${worst:,.2f}" in gpu_type.description
    # a type partitioned with MIG: priced per slice of each profile (a 1g of 3 x 1g + 2 x 2g: 1/7 of the GPU)
    mig = config.gpu_types["a100-mig"]
    one_g = config.slot_types["a100-mig.1g.10gb"]
    assert one_g.price_per_hour == pytest.approx(mig.price_per_hour / 7)
    assert gpu_type.schema["values_display"]["a100-mig"] == (
        f"a100-mig: MIG slices, name one in resources.mig_profile: 1g.10gb ${one_g.price_per_hour:.2f} per "
        f"slice-hour ({one_g.slots}), 2g.20gb ${config.slot_types['a100-mig.2g.20gb'].price_per_hour:.2f} per "
        f"slice-hour ({config.slot_types['a100-mig.2g.20gb'].slots})"
    )
    worst_slice = DEFAULTS["resources"]["max_hours"] * DEFAULTS["resources"]["gpus_per_node"] * one_g.price_per_hour
    assert f"a100-mig.1g.10gb ${worst_slice:,.2f}" in gpu_type.description
    assert "a100-mig $" not in gpu_type.description  # no whole GPU of it is ever priced
    assert fields["resources.team"].schema["enum"] == list(config.teams)
    # a team's own DAG: its team is fixed (Airflow's form hides an input with a const)
    own = form_fields({**DEFAULTS, "resources": {**DEFAULTS["resources"], "team": "vision"}}, config, "vision")
    assert own["resources.team"].schema["const"] == "vision" and own["resources.team"].default == "vision"
    # no resources file that parses: free text, which admission checks
    free = form_fields(DEFAULTS, None, None)
    assert "enum" not in free["resources.gpu_type"].schema and "enum" not in free["resources.team"].schema


def test_the_forms_conf_and_a_rest_conf_read_back_as_one_jobspec(fields):
    assert parse_spec(spec_input(_sent_by_the_form(fields))) == JobSpec()
    by_form = parse_spec(
        spec_input(_sent_by_the_form(fields, hyperparameters__epochs=3, resources__gpu_type="a100-80gb"))
    )
    by_rest = parse_spec(spec_input({"hyperparameters": {"epochs": 3}, "resources": {"gpu_type": "a100-80gb"}}))
    assert by_form == by_rest and by_form.hyperparameters.epochs == 3
    mixed = spec_input({"hyperparameters": {"epochs": 3}, "hyperparameters.batch_size": 8, "name": "mixed"})
    assert mixed == {"hyperparameters": {"epochs": 3, "batch_size": 8}, "name": "mixed"}
    # an optional section: all empty is no section; any field given makes one, checked as a whole
    assert spec_input({"sweep.name": None, "sweep.trials": None}) == {}
    with pytest.raises(SpecError, match="sweep.name: required"):
        parse_spec(spec_input(_sent_by_the_form(fields, sweep__trials=4)))
    # a field under an unknown section, or an unknown field, is refused by name
    with pytest.raises(SpecError, match="hyperparameters.epoch: unknown field"):
        parse_spec(spec_input({"hyperparameters.epoch": 3}))
    with pytest.raises(SpecError, match="hyperparams: unknown field"):
        parse_spec(spec_input({"hyperparams.epochs": 3}))


def test_a_field_given_twice_with_two_values_is_refused_by_name():
    assert spec_input({"hyperparameters": {"epochs": 3}, "hyperparameters.epochs": 3}) == {
        "hyperparameters": {"epochs": 3}
    }
    with pytest.raises(ConfError, match=r"hyperparameters.epochs is given twice: 3 in hyperparameters and 5 as"):
        spec_input({"hyperparameters": {"epochs": 3}, "hyperparameters.epochs": 5})
    with pytest.raises(ConfError, match="resources is given both as 'a100' and field by field .*: give it one way"):
        spec_input({"resources": "a100", "resources.gpus_per_node": 2})
    with pytest.raises(
        ConfError, match="kubernetes.env.FOO: a field's path is section.field; give kubernetes.env whole"
    ):
        spec_input({"kubernetes.env.FOO": "1"})
    with pytest.raises(ConfError, match="a run's conf is a JSON object of JobSpec fields, not a list"):
        spec_input(["epochs", 3])  # type: ignore[arg-type]
