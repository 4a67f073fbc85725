"""The trainer image, checked without a Docker engine: what ./Dockerfile installs (exactly the pinned
requirements and this package, Horovod through scripts/build_horovod.sh), that what the Kubernetes pods run
exists in it, and that `make image` tags it as the JobSpec's default image."""

import fnmatch
import importlib
import importlib.metadata
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

import trainyard
from trainyard.spec import KubernetesSpec, parse_spec
from trainyard.training.launchers import kubernetes as K

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction: comments dropped, '\\' continuations joined."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


INSTRUCTIONS = instructions(DOCKERFILE.read_text())


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (a stage starts at FROM); the last one is the image."""
    out: list[list[tuple[str, str]]] = []
    for ins in INSTRUCTIONS:
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def build_args() -> dict[str, str]:
    """Default values of every ARG, for expanding ${NAME} the way the build does with no --build-arg."""
    found = {}
    for word, rest in INSTRUCTIONS:
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            found[name] = value
    return found


def commands(run: str) -> list[list[str]]:
    """The simple commands of a RUN line (split at && / || / ;), each as an argv."""
    argv_list, argv = [], []
    for token in shlex.split(run, posix=True):
        if token in ("&&", "||", ";"):
            argv_list.append(argv)
            argv = []
        else:
            argv.append(token)
    return [a for a in argv_list + [argv] if a]


def pip_installs() -> list[list[str]]:
    """The arguments after `pip install` of every pip call in every RUN, in order."""
    found = []
    for word, rest in INSTRUCTIONS:
        if word != "RUN":
            continue
        for argv in commands(rest):
            names = [Path(a).name for a in argv]
            for i, name in enumerate(names[:-1]):
                if name in ("pip", "pip3") and names[i + 1] == "install":
                    found.append(argv[i + 2 :])
                elif name.startswith("python") and argv[i + 1 : i + 4] == ["-m", "pip", "install"]:
                    found.append(argv[i + 4 :])
    return found


OPTIONS_WITH_VALUE = {
    "-r",
    "--requirement",
    "-c",
    "--constraint",
    "-e",
    "--editable",
    "--index-url",
    "-i",
    "--extra-index-url",
    "--find-links",
    "-f",
}


def parse_install(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """pip install arguments -> ({option: [values]}, [positional requirements])."""
    options: dict[str, list[str]] = {}
    positional = []
    it = iter(args)
    for a in it:
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if name in OPTIONS_WITH_VALUE and not eq:
                value = next(it)
            options.setdefault(name, []).append(value)
        else:
            positional.append(a)
    return options, positional


def copied_sources() -> set[str]:
    """Paths the build copies from the build context (COPY/ADD without --from)."""
    out = set()
    for word, rest in INSTRUCTIONS:
        if word in ("COPY", "ADD"):
            parts = shlex.split(rest)
            if any(p.startswith("--from") for p in parts):
                continue
            srcs = [p for p in parts if not p.startswith("--")][:-1]
            out.update(s.rstrip("/") or "." for s in srcs)
    return out


def test_installs_exactly_the_pinned_requirements_and_this_package():
    installs = [parse_install(a) for a in pip_installs()]
    assert installs, "the Dockerfile runs no pip install"
    pinned = [(o, p) for o, p in installs if o.get("-r") or o.get("--requirement")]
    assert len(pinned) == 1, f"expected one install of the requirements file, found {pinned}"
    options, positional = pinned[0]
    assert options.get("-r", []) + options.get("--requirement", []) == ["requirements.txt"]
    assert options.get("-c", []) + options.get("--constraint", []) == ["constraints.txt"], (
        "requirements.txt must be installed under constraints.txt, the full resolved set"
    )
    assert positional == [], f"packages named beside the requirements file: {positional}"

    own = [(o, p) for o, p in installs if (o, p) != pinned[0]]
    assert len(own) == 1, f"expected one more pip install (this package), found {own}"
    options, positional = own[0]
    target = positional + options.get("-e", []) + options.get("--editable", [])
    assert target == ["."], f"the second install must be this repository ('.'), got {target}"
    assert "--no-deps" in options, "this package's install must not pull in anything the pins did not"
    assert {"requirements.txt", "constraints.txt", "pyproject.toml", "include"} <= copied_sources()
    # The package that `pip install .` builds is the one the pods import: pyproject maps include/trainyard.
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"] == ["include"]


def test_torch_variant_keeps_the_pinned_version():
    """The only index added is the torch wheel index of the variant; the pin itself stays requirements.txt's."""
    options, _ = next(parse_install(a) for a in pip_installs() if "-r" in a or "--requirement" in a)
    extra = [u for u in options.get("--extra-index-url", []) if u]
    assert len(extra) == 1 and re.fullmatch(r"https://download\.pytorch\.org/whl/\$\{TORCH_VARIANT\}", extra[0]), extra
    assert build_args().get("TORCH_VARIANT") == "cpu", "the default image must be the CPU build this project tests"
    assert "--index-url" not in options and "-i" not in options, "PyPI must stay the index for everything else"
    torch_pin = [line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("torch==")]
    assert len(torch_pin) == 1, "requirements.txt must pin torch exactly"


def test_horovod_is_built_by_the_setup_script():
    script = "scripts/build_horovod.sh"
    assert script in copied_sources()
    runs = [argv for word, rest in INSTRUCTIONS if word == "RUN" for argv in commands(rest)]
    built = [i for i, argv in enumerate(runs) if argv[0] in (script, f"./{script}") or argv[-1:] == [script]]
    assert len(built) == 1, f"Horovod must be built by {script}, once"
    # It compiles against the installed torch, so it runs after the requirements.
    order = [rest for word, rest in INSTRUCTIONS if word == "RUN"]
    req_at = next(i for i, r in enumerate(order) if "requirements.txt" in r)
    hvd_at = next(i for i, r in enumerate(order) if script in r)
    assert req_at < hvd_at
    assert "horovod" not in " ".join(" ".join(a) for a in pip_installs()), (
        "Horovod is installed by the script, not a second way"
    )
    # setup.sh runs the same script, so the image and `make setup` build Horovod identically.
    assert script in (REPO / "scripts/setup.sh").read_text()
    assert (REPO / script).stat().st_mode & 0o111, f"{script} must be executable"


@pytest.mark.parametrize("strategy", ["ddp", "horovod", "deepspeed"])
def test_the_pods_command_exists_in_the_image(strategy):
    """The pod's argv[0] is a console script of a pinned requirement (in the venv's bin, on the image's PATH)
    and the module it runs is in this package."""
    spec = parse_spec({"name": "digits", "backends": {"launcher": "kubernetes"}, "distributed": {"strategy": strategy}})
    argv = K.worker_command(spec, "train_pipeline/manual__1", "/var/trainyard/runs/x/run_config.json")
    program = argv[0]
    owners = [
        d.metadata["Name"]
        for d in importlib.metadata.distributions()
        if any(ep.name == program for ep in d.entry_points.select(group="console_scripts"))
    ]
    assert owners, f"no installed distribution provides the {program!r} the pods run"
    requirements = {
        re.split(r"[=<>!~\[ ]", line, maxsplit=1)[0].lower().replace("_", "-")
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert any(o.lower().replace("_", "-") in requirements for o in owners), (
        f"{program!r} comes from {owners}, none of which requirements.txt pins"
    )
    module = argv[argv.index("-m") + 1]
    found = importlib.util.find_spec(module)
    assert found is not None and found.origin is not None, f"{module} is not importable"
    assert Path(found.origin).resolve().is_relative_to(REPO / "include" / "trainyard"), found.origin
    image_env = " ".join(rest for word, rest in stages()[-1] if word == "ENV")
    assert re.search(r"\bPATH=/opt/venv/bin:", image_env), "the venv's bin (torchrun, trainyard) must lead PATH"


def test_the_trainyard_console_script_exists():
    target = PYPROJECT["project"]["scripts"]["trainyard"]
    module, _, attr = target.partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    cmd = json.loads(next(rest for word, rest in stages()[-1] if word == "CMD"))
    assert cmd[0] in PYPROJECT["project"]["scripts"], f"the image's default command {cmd} is not this package's"


def test_make_image_tags_the_default_kubernetes_image():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "image"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    builds = [shlex.split(line) for line in out.splitlines() if re.match(r"^\S*docker build ", line)]
    assert len(builds) == 1, out
    argv = builds[0]
    tag = argv[argv.index("-t") + 1]
    assert argv[-1] == "."
    assert tag == trainyard.TRAINER_IMAGE == KubernetesSpec().image
    assert trainyard.TRAINER_IMAGE.endswith(f":{trainyard.__version__}")


def test_base_image_python_satisfies_requires_python():
    base = build_args()["PYTHON_IMAGE"]
    m = re.fullmatch(r"python:(\d+)\.(\d+)(?:\.\d+)?-slim(?:-\w+)?", base)
    assert m, f"expected an official python:<major>.<minor>-slim image, got {base}"
    version = f"{m[1]}.{m[2]}"
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(version)
    # constraints.txt is a freeze from the project's interpreter; its cp3XX wheels need the same minor.
    assert PYPROJECT["tool"]["mypy"]["python_version"] == version
    assert [rest.split()[0] for word, rest in INSTRUCTIONS if word == "FROM"] == ["${PYTHON_IMAGE}"] * len(stages())


def test_image_runs_as_a_non_root_user():
    users = [rest for word, rest in stages()[-1] if word == "USER"]
    assert users, "the image must name a USER"
    user = users[-1].split(":")[0]
    user = build_args().get(user.strip("${}"), user)
    assert user not in ("root", "0"), f"the image runs as {users[-1]}"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore matching, enough for these patterns: the last pattern that matches the path or
    a parent folder of it decides; a leading '**/' matches any depth (fnmatch's '*' crosses '/')."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.removeprefix("!").strip("/")
        forms = [pat, "*/" + pat[3:], pat[3:]] if pat.startswith("**/") else [pat]
        if any(fnmatch.fnmatchcase(p, f) for p in prefixes for f in forms):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_local_state_out_and_the_sources_in():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for local in (
        ".venv",
        ".airflow",
        "var",
        ".git",
        ".venv/lib/x.py",
        "var/runs/a/b",
        "include/trainyard/__pycache__",
    ):
        assert _ignored(local, patterns), f"{local} reaches the build context"
    for src in copied_sources() | {"include/trainyard/training/entry.py", "include/config/resources.yaml"}:
        assert not _ignored(src, patterns), f".dockerignore drops {src}, which the Dockerfile copies"


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip(
            "hadolint is not installed (it is on neither PyPI nor Debian; get the binary from "
            "github.com/hadolint/hadolint to run this check)"
        )
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pods_run_as_the_images_user():
    """The pods' securityContext names the uid the Dockerfile creates, so the volume is writable."""
    from trainyard.training.launchers import kubernetes as K

    assert re.search(rf"^ARG TRAINER_UID={K.TRAINER_UID}$", DOCKERFILE.read_text(), re.M)
