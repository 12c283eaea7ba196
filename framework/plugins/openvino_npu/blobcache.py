"""OpenVINO's compiled-model cache (CACHE_DIR), checked before OpenVINO may import from it.

OpenVINO writes one ``<hash>.blob`` per compiled model into CACHE_DIR and imports it when the same
model is compiled again, without checking what the file holds: a flipped byte gives garbage text, a
write cut short by a signal leaves a stub. So the plugin keeps ``manifest.json`` beside the blobs, with
each blob's size and digest:

  * after a compile, the blobs the manifest does not know (the ones that compile wrote) are recorded;
  * before a compile, every blob is checked against the manifest (its size always; its digest once per
    process, and again whenever its size or modification time changes); a blob the manifest does not
    know or that does not match (truncated, corrupt, foreign, half-written) is deleted and reported, and
    OpenVINO compiles that model afresh;
  * the check, the compile and the recording hold the folder's lock (caches.locked), so two processes
    filling one cache never record each other's half-written blobs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from ...contract import caches

MANIFEST = "manifest.json"
FORMAT = "framework-openvino-blobs/1"

# blobs whose digest this process has checked: path -> (size, mtime_ns)
_VERIFIED: dict[str, tuple[int, int]] = {}


class BlobCache:
    def __init__(self, folder: Path):
        self.folder = folder
        self.rejected: list[str] = []           # what this process deleted, and why

    # -- manifest ------------------------------------------------------------------------------------
    def _read(self) -> dict[str, dict]:
        path = self.folder / MANIFEST
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT or not isinstance(data.get("blobs"), dict):
                raise ValueError(f"format {data.get('format')!r}")
            return {str(k): v for k, v in data["blobs"].items() if isinstance(v, dict)}
        except (OSError, ValueError, AttributeError) as e:
            caches.report(f"OpenVINO cache manifest {path} is unreadable ({type(e).__name__}: {e}): every blob it "
                          f"listed is checked as unknown")
            return {}

    def _write(self, blobs: dict[str, dict]) -> None:
        text = json.dumps({"format": FORMAT, "digest": caches.DIGEST, "blobs": blobs}, indent=1, sort_keys=True)
        caches.write_atomic(self.folder / MANIFEST, text)

    # -- the checks --------------------------------------------------------------------------------------
    def _reject(self, blob: Path, why: str) -> None:
        with contextlib.suppress(OSError):
            blob.unlink()
        _VERIFIED.pop(str(blob), None)
        self.rejected.append(f"{blob.name}: {why}")
        caches.report(f"OpenVINO cache blob {blob} {why}: deleted, the model it held is compiled again")

    def check(self) -> dict[str, dict]:
        """Delete every blob that does not match the manifest; the manifest of the blobs that remain."""
        known = self._read()
        kept: dict[str, dict] = {}
        for blob in sorted(self.folder.glob("*.blob")):
            entry = known.get(blob.name)
            try:
                st = blob.stat()
            except OSError:
                continue
            if entry is None:
                self._reject(blob, f"({st.st_size} bytes) is not in the manifest (a write cut short, or a file "
                                   f"from elsewhere)")
                continue
            if st.st_size != entry.get("size"):
                self._reject(blob, f"holds {st.st_size} bytes, the manifest recorded {entry.get('size')} (truncated "
                                   f"or replaced)")
                continue
            stamp = (st.st_size, st.st_mtime_ns)
            if _VERIFIED.get(str(blob)) != stamp:
                digest = caches.digest_file(blob)
                if digest != entry.get("digest"):
                    self._reject(blob, f"has digest {digest}, the manifest recorded {entry.get('digest')} (corrupt)")
                    continue
                _VERIFIED[str(blob)] = stamp
            kept[blob.name] = entry
        return kept

    def record(self, kept: dict[str, dict]) -> None:
        """After a compile: add the blobs it wrote to the manifest (and drop those trimmed since)."""
        blobs = dict(kept)
        for blob in sorted(self.folder.glob("*.blob")):
            if blob.name in blobs:
                continue
            try:
                st = blob.stat()
                digest = caches.digest_file(blob)
            except OSError:
                continue
            blobs[blob.name] = {"size": st.st_size, "digest": digest}
            _VERIFIED[str(blob)] = (st.st_size, st.st_mtime_ns)
        blobs = {n: e for n, e in blobs.items() if (self.folder / n).is_file()}
        self._write(blobs)

    @contextlib.contextmanager
    def compiling(self) -> Iterator[None]:
        """Around one compile_model with CACHE_DIR = this folder: check, compile, record, under the lock."""
        with caches.locked(self.folder):
            kept = self.check()
            yield
            self.record(kept)
