"""A worker host's GPUs by type (its inventory), its name, and the executor queue of each GPU type.

A host says what it has in ``TRAINYARD_GPU_DEVICES``:

* typed, ``<type>=<device>,<device>;<type>=...``: each GPU type the host serves with its devices (CUDA
  indices or MIG UUIDs), e.g. ``h100-80gb=0,1;a100-80gb=2,3``; a MIG type's slices by profile, each its
  own slot type (``a100-mig.1g.10gb=MIG-<uuid>,MIG-<uuid>``); a type whose slots are no devices (the
  ``cpu`` type) is listed bare, ``cpu=``. The host runs only those types' trainings, each on its own type's
  devices; its worker serves only their queues (:func:`training_queue_of`, ``trainyard worker``);
* untyped, ``0,1``: the devices of a one-type host from before types were routed, handed to a job of any
  type;
* unset: every CUDA device torch sees, untyped.

``TRAINYARD_HOST`` names the host in the ledger (default: its hostname): the devices a job holds are
recorded with it, and a worker's announcement (:meth:`~trainyard.scheduling.admission.ledger.Ledger.announce`)
says which types it serves. Several workers on one machine (the cluster profile) each set their own.

``TRAINYARD_HOST_ADDRESS`` is where the other nodes of a multi-node job reach this host (default: the address
its hostname resolves to): node 0 serves its rendezvous there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from trainyard.errors import PermanentError
from trainyard.scheduling.cluster import CPU_TYPE
from trainyard.scheduling.resources import NAME
from trainyard.spec import MIG_PROFILE_RE

DEVICES_ENV = "TRAINYARD_GPU_DEVICES"
HOST_ENV = "TRAINYARD_HOST"
ADDRESS_ENV = "TRAINYARD_HOST_ADDRESS"
# a GPU type, or a MIG type's profile as a slot type of its own (a100-mig.1g.10gb): what a host serves
SLOT_TYPE = NAME.removesuffix("$") + "(?:[.]" + MIG_PROFILE_RE.removeprefix("^")[:-1] + ")?$"
_DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:-]*$")  # a CUDA index or a MIG UUID (MIG-<uuid>, MIG-GPU-.../1/0)


class InventoryError(PermanentError, ValueError):
    """``TRAINYARD_GPU_DEVICES`` is not an inventory: what is wrong is named, with the form it takes."""


class HostLacksType(PermanentError):
    """A training of a GPU type reached a host whose inventory does not list that type: it would train on
    another type's devices and be billed at its own type's price. Routing sends a type's trainings only to
    the workers that serve it (``[trainyard] training_queue``); this host was given one anyway."""


@dataclass(frozen=True)
class Inventory:
    """This host's GPUs: ``by_type`` for a typed inventory (type -> its devices), else ``untyped``."""

    by_type: dict[str, tuple[str, ...]] | None = None
    untyped: tuple[str, ...] = ()

    @property
    def typed(self) -> bool:
        return self.by_type is not None

    def devices_for(self, gpu_type: str, host: str = "") -> list[str] | None:
        """The devices a job of ``gpu_type`` may be handed here; None for the ``cpu`` type (its slots are no
        devices). HostLacksType where a typed inventory does not list the type."""
        if self.by_type is not None and gpu_type not in self.by_type:
            raise HostLacksType(
                f"host {host or host_name()!r} has no {gpu_type!r} GPUs ({DEVICES_ENV} lists "
                f"{sorted(self.by_type)}): its trainings must be routed to a worker that serves {gpu_type!r} "
                f"(set [trainyard] training_queue, and start that worker with `trainyard worker`)"
            )
        if gpu_type == CPU_TYPE:
            return None
        return list(self.by_type[gpu_type] if self.by_type is not None else self.untyped)


def _devices(text: str, where: str) -> tuple[str, ...]:
    devices = tuple(d.strip() for d in text.split(",") if d.strip())
    bad = [d for d in devices if not _DEVICE.match(d)]
    if bad:
        raise InventoryError(f"{DEVICES_ENV}: {bad} in {where!r} are not device names (CUDA indices or MIG UUIDs)")
    return devices


def parse_inventory(text: str) -> Inventory:
    """``TRAINYARD_GPU_DEVICES`` read (the module's docstring gives its forms); InventoryError naming what
    is wrong: a type listed twice, a device listed under two types or twice, an entry that is not
    ``<type>=<devices>``."""
    if "=" not in text:
        untyped = _devices(text, text)
        if len(set(untyped)) != len(untyped):
            raise InventoryError(f"{DEVICES_ENV}={text!r} lists a device twice")
        return Inventory(untyped=untyped)
    by_type: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        gpu_type, sep, listed = (part.strip() for part in entry.partition("="))
        if not sep or not re.match(SLOT_TYPE, gpu_type):
            raise InventoryError(
                f"{DEVICES_ENV}: {entry!r} is not '<gpu type>=<device>,<device>' (e.g. 'h100-80gb=0,1;cpu=')"
            )
        if gpu_type in by_type:
            raise InventoryError(f"{DEVICES_ENV}: GPU type {gpu_type!r} is listed twice; list its devices once")
        devices = _devices(listed, entry)
        if (gpu_type == CPU_TYPE) == bool(devices):
            raise InventoryError(
                f"{DEVICES_ENV}: {entry!r}: "
                + (
                    f"the {CPU_TYPE} type's slots are no devices: list it bare, '{CPU_TYPE}='"
                    if devices
                    else f"GPU type {gpu_type!r} lists no devices; name them ('{gpu_type}=0,1')"
                )
            )
        if len(set(devices)) != len(devices):
            raise InventoryError(f"{DEVICES_ENV}: {entry!r} lists a device twice")
        for device in devices:
            if device in seen:
                raise InventoryError(
                    f"{DEVICES_ENV}: device {device!r} is listed under {seen[device]!r} and {gpu_type!r}; "
                    "a device is of one type"
                )
            seen[device] = gpu_type
        by_type[gpu_type] = devices
    return Inventory(by_type=by_type)


def host_inventory() -> Inventory:
    """This host's inventory: ``TRAINYARD_GPU_DEVICES`` when set, else every CUDA device torch sees."""
    listed = os.environ.get(DEVICES_ENV)
    if listed is not None:
        return parse_inventory(listed)
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Inventory(untyped=tuple(str(i) for i in range(count)))


def devices_here(gpu_type: str) -> list[str] | None:
    """What a job of ``gpu_type`` may be handed on this host (:meth:`Inventory.devices_for`); the ``cpu`` type
    on a host that lists nothing needs no inventory (nor torch's import to count its GPUs)."""
    if gpu_type == CPU_TYPE and DEVICES_ENV not in os.environ:
        return None
    return host_inventory().devices_for(gpu_type)


def host_name() -> str:
    """This host's name in the ledger: ``TRAINYARD_HOST``, else its hostname."""
    import socket

    return os.environ.get(HOST_ENV) or socket.gethostname()


def host_address() -> tuple[str, str]:
    """Where the other nodes of a multi-node job reach this host: its address (``TRAINYARD_HOST_ADDRESS``, else
    the one its hostname resolves to) and the network interface that has it. PermanentError where no
    interface of this host has it (a name that resolves to loopback, or to another network's address)."""
    import socket

    import psutil  # type: ignore[import-untyped]  # (no stubs installed)

    address = os.environ.get(ADDRESS_ENV) or socket.gethostbyname(socket.gethostname())
    for interface, addresses in psutil.net_if_addrs().items():
        if interface != "lo" and any(a.address == address for a in addresses):
            return address, interface
    raise PermanentError(
        f"this host's address {address} ({ADDRESS_ENV} or its hostname's) is on none of its network interfaces "
        f"but loopback, so the other nodes of a multi-node job cannot reach it: set {ADDRESS_ENV} for its worker"
    )


def routing_prefix() -> str | None:
    """``[trainyard] training_queue``: the prefix of the per-type training queues; None where trainings are
    not routed (LocalExecutor: one queue). Read from Airflow's configuration, as its scheduler reads it (an
    import of seconds: for Airflow's processes and ``trainyard worker``)."""
    from airflow.configuration import conf

    return conf.get("trainyard", "training_queue", fallback=None) or None


def training_queue_of(training_queue: str, gpu_type: str) -> str:
    """The executor queue of ``gpu_type``'s trainings where trainings are routed to ``training_queue``
    (``[trainyard] training_queue``): ``gpu`` gives ``gpu-h100-80gb``, the name of the type's pool."""
    return f"{training_queue}-{gpu_type}"
