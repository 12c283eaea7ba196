"""Connecting to a Ray cluster, finding the nodes that lend devices, and talking to their agents.

A node lends its devices when it was started with a custom resource ``framework:NAME``; its devices are named
``ray:NAME/DEVICE``. One agent per node and per connection, kept for the process: a registry is built often
(every command, every test), a node's agent and the weights it holds are not.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import numpy as np

from ...contract import Device, DeviceType, Verdict, settings
from .agent import NodeAgent, contract_version, file_sha256, framework_version

ADDRESS_ENV = "RAY_ADDRESS"               # the cluster, as Ray itself reads it; --ray-address sets it
PLUGINS_ENV = "FRAMEWORK_RAY_PLUGINS"     # which plugins the agents load (default: all but ray)
TIMEOUT_ENV = "FRAMEWORK_RAY_TIMEOUT"     # seconds any wait for a node may take
DEFAULT_TIMEOUT = 60.0
RESOURCE = "framework:"
MIN_RAY = "2.60"

_links: dict[tuple[str, str], NodeLink] = {}    # (Ray node id, node name) -> its link


class RemoteNodeError(RuntimeError):
    """A node died or did not answer in time (the executor reports it as a DeviceRunError)."""


settings.declare(PLUGINS_ENV, "ray", "comma-separated names of backend plugins", (),
                 "the plugins the nodes' agents load (unset: all but ray)", settings.names)
settings.declare(TIMEOUT_ENV, "ray", "a number of seconds above 0", DEFAULT_TIMEOUT,
                 "how long any wait for a node may take", settings.number(0.0, above=True))


def timeout() -> float:
    """FRAMEWORK_RAY_TIMEOUT (a SettingError, a ValueError, naming it when it is not a finite positive
    number: a NaN or negative wait would never end or end at once)."""
    return settings.read(TIMEOUT_ENV)


class NodeLink:
    """One node's agent: every call to it has a timeout, and a failure names the node."""

    def __init__(self, ray, name: str, node: dict, agent):
        self.ray, self.name, self.agent = ray, name, agent
        self.node_id, self.host = node["NodeID"], node.get("NodeManagerAddress", "?")
        self.info: dict = {}
        self.version = "?"
        self.files: dict[str, str] = {}     # model file path -> "" (the node has it) or why not

    def where(self) -> str:
        return f"node {self.name} ({self.host}, Ray node {self.node_id[:16]})"

    def wait(self, ref, doing: str) -> Any:
        ray, limit = self.ray, timeout()
        try:
            return ray.get(ref, timeout=limit)
        except ray.exceptions.GetTimeoutError:
            raise RemoteNodeError(f"{self.where()} did not answer within {limit:g} s while {doing} "
                                  f"({TIMEOUT_ENV} sets the limit); the node holds this session's weights and "
                                  f"KV cache: start a new session when it is back") from None
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError) as e:
            raise RemoteNodeError(f"{self.where()} is gone ({self.state()}) while {doing}: {type(e).__name__}; "
                                  f"the session cannot go on without the weights and KV cache it held") from None
        except ray.exceptions.RayTaskError as e:      # the node's own device failed: keep its words
            raise RemoteNodeError(f"{self.where()} failed while {doing}: {e.cause!r}") from None

    def call(self, doing: str, method: str, *args) -> Any:
        return self.wait(getattr(self.agent, method).remote(*args), doing)

    def state(self) -> str:
        alive = {n["NodeID"]: n["Alive"] for n in self.ray.nodes()}
        return "Ray reports the node dead" if not alive.get(self.node_id, False) else "its agent died"

    def file_origin(self, raw: np.ndarray) -> tuple[str, int, int] | None:
        """Where ``raw`` lies in a file, when it is a slice of a memory-mapped model file that this node holds
        with the same sha256: (path, offset, bytes). None: its bytes are shipped."""
        root = raw
        while isinstance(root.base, np.ndarray):
            root = root.base
        path = getattr(root, "filename", None)
        if not isinstance(root, np.memmap) or not path:
            return None
        if path not in self.files:
            self.files[path] = self.call(f"opening {path}", "open_file", path, file_sha256(path))
        if self.files[path]:
            return None
        start = raw.__array_interface__["data"][0] - root.__array_interface__["data"][0] + root.offset
        return path, int(start), int(raw.nbytes)


class Unavailable(Device):
    """A device that cannot be used, and why: Ray missing, no address, or a node refused."""

    def __init__(self, name: str, reason: str, description: str = ""):
        self.name, self.type, self.available, self.unavailable_reason = name, DeviceType.CPU, False, reason
        self.description = description

    def supports_op(self, node) -> Verdict:
        return Verdict.no("unavailable", self.unavailable_reason)

    def compile(self, fragment):
        raise RuntimeError(f"{self.name} is unavailable: {self.unavailable_reason}")


def remote_devices() -> list[Device]:
    address = os.environ.get(ADDRESS_ENV)
    if not address:
        return [Unavailable("ray", "not connected to a Ray cluster: pass --ray-address HOST:PORT or set "
                            "RAY_ADDRESS (docs/distributed.md)")]
    try:
        import ray
    except ImportError:
        return [Unavailable("ray", f"Ray is not installed: pip install 'framework[ray]' (ray>={MIN_RAY})")]
    if not ray.is_initialized():
        _links.clear()
        why = unreachable(address)
        if why:
            return [Unavailable("ray", f"cannot connect to the Ray cluster: {why}")]
        ray.init(address=address, namespace="framework", log_to_driver=False, logging_level="ERROR")
    nodes = [(key[len(RESOURCE):], n) for n in ray.nodes() if n["Alive"]
             for key in n["Resources"] if key.startswith(RESOURCE)]
    if not nodes:
        return [Unavailable("ray", f"the Ray cluster at {address} has no node with a '{RESOURCE}NAME' resource: "
                            f"start each node that lends its devices with ray start --resources "
                            f"'{{\"{RESOURCE}NAME\": 1}}'")]
    devices: list[Device] = []
    for name, node in sorted(nodes):
        devices += _node_devices(ray, name, node)
    return devices


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": Ray keeps loopback addresses (as on macOS)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def unreachable(address: str) -> str:
    """Why ray.init would not connect (it would wait without end), or ''. ``address`` is HOST:PORT or 'auto'.
    Ray connects to a loopback host through this machine's network address (where ``ray start`` makes the head
    listen) unless LOOPBACK_ENV=0, so that is where it is asked whether anything answers."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return ""                       # "auto", or a form Ray resolves itself
    import ray.util
    there = ray.util.get_node_ip_address() if host in LOOPBACK else host
    if _answers(there, int(port)):
        return ""
    if there != host and _answers(host, int(port)):
        return (f"{address} answers on loopback only (a cluster in Ray's loopback mode, {LOOPBACK_ENV}=0), and Ray "
                f"connects to {there}:{port} instead: set {LOOPBACK_ENV}=0 for this process too")
    return f"nothing answers at {address}{f' ({there}:{port})' if there != host else ''}: is the cluster's head " \
           f"node running there?"


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


def _node_devices(ray, name: str, node: dict) -> list[Device]:
    from .device import RayDevice
    link = _links.get((node["NodeID"], name))
    try:
        if link is None:
            plugins = list(settings.read(PLUGINS_ENV)) or None
            agent = ray.remote(NodeAgent).options(num_cpus=0, resources={RESOURCE + name: 0.001},
                                                 max_restarts=0).remote(plugins)
            link = NodeLink(ray, name, node, agent)
            link.info = link.call("listing its devices", "describe")
            link.version = link.info["framework"]
            _links[(node["NodeID"], name)] = link
    except RemoteNodeError as e:
        return [Unavailable(f"ray:{name}", str(e))]
    info = link.info
    here = (framework_version(), contract_version())
    there = (info["framework"], info["contract"])
    if here != there:
        reason = (f"node {name} runs framework {there[0]} (contract {there[1]}), this process framework {here[0]} "
                  f"(contract {here[1]}): install the same framework version on every node")
        return [Unavailable(f"ray:{name}/{d['name']}", reason) for d in info["devices"]] or \
            [Unavailable(f"ray:{name}", reason)]
    return [RayDevice(link, d) for d in info["devices"]] or [
        Unavailable(f"ray:{name}", f"node {name} offers no devices" + "".join(f"; {e}" for e in info["plugin_errors"]))]
