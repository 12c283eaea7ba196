"""OpenVINO's compiled-model cache (CACHE_DIR), checked before OpenVINO may import from it.

OpenVINO writes one ``<hash>.blob`` per compiled model into CACHE_DIR and imports it when the same
model is compiled again, without checking what the file holds: a flipped byte gives garbage text, a
write cut short by a signal leaves a stub. So the plugin keeps ``manifest.json`` beside the blobs, with
each blob's size and digest (``caches.Manifest``, as numba's and PoCL's caches have):

  * after a compile, the blobs the manifest does not know (the ones that compile wrote) are recorded;
  * before a compile, every blob is checked against the manifest; a blob the manifest does not know or
    that does not match (truncated, corrupt, foreign, half-written) is deleted and reported, and
    OpenVINO compiles that model afresh;
  * the check, the compile and the recording hold the folder's lock, so two processes filling one cache
    never record each other's half-written blobs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ...contract import caches

FORMAT = "framework-openvino-blobs/1"


class BlobCache(caches.Manifest):
    def __init__(self, folder: Path):
        super().__init__(folder, "OpenVINO cache blob", "the model it held is compiled again", pattern="*.blob",
                         format=FORMAT, entries="blobs")

    @contextlib.contextmanager
    def compiling(self) -> Iterator[None]:
        """Around one compile_model with CACHE_DIR = this folder: check, compile, record, under the lock."""
        with self.using():
            yield
