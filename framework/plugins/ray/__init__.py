"""The ray plugin: the devices of other machines' framework installations, reached through a Ray cluster.

Optional (``pip install 'framework[ray]'``); docs/distributed.md says how devices appear, what crosses the
network and how faults are reported. Nothing is imported from Ray until an address is given.
"""

from ...contract import hookimpl


@hookimpl
def framework_devices():
    from .cluster import remote_devices
    return remote_devices()
