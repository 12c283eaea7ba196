"""The tile geometry of packed weights: the one definition used both to pack and to read.

A weight of shape (N, K) (numpy order: N output rows, K inputs) is stored as a grid of tiles of
TILE_ROWS x TILE_COLS elements, row-tile major::

    tile (rt, ct), rt < row_tiles, ct < col_tiles, at byte (rt * col_tiles + ct) * CHUNK_BYTES

Each tile (a *chunk* of kind CHUNK_KIND) holds 32 rows of 256 values as Q4_1 groups of 32::

    bytes    0 ..  511   256 bfloat16 scales   d[r, g], row r (0..31) major, group g (0..7)
    bytes  512 .. 1023   256 bfloat16 minimums m[r, g], same order
    bytes 1024 .. 5119   4096 bytes of nibbles: row r at 1024 + 128 r; byte j holds column 2j in
                         its low nibble and column 2j + 1 in its high nibble

    value[r, c] = d[r, c // 32] * q[r, c] + m[r, c // 32]      (q in 0..15)

K is padded to a multiple of 256 and N to a multiple of 32; padding holds q = d = m = 0. A container
may store a tensor on a grid *wider* than its shape needs (another packer padded 8960 to 9216): the
reader accepts it only when the manifest declares that padded shape and the byte size is exactly
``tiles x CHUNK_BYTES`` for it; it then decodes on that grid and crops. Anything else is a
:class:`GeometryError` naming the tensor, its offset, its size, the valid sizes and the remainder.
"""

from __future__ import annotations

from dataclasses import dataclass

TILE_ROWS = 32
TILE_COLS = 256
GROUP = 32                                   # Q4_1 group: one scale and one minimum per 32 values
GROUPS_PER_TILE = TILE_ROWS * TILE_COLS // GROUP    # 256
SCALE_BYTES = GROUPS_PER_TILE * 2            # 256 bfloat16
NIBBLE_BYTES = TILE_ROWS * TILE_COLS // 2    # 4096
CHUNK_BYTES = 2 * SCALE_BYTES + NIBBLE_BYTES  # 5120
CHUNK_KIND = "q4_1_tile_32x256_bf16"
GEOMETRY_VERSION = 1

assert CHUNK_BYTES == 5120


class GeometryError(ValueError):
    """A packed tensor whose bytes do not fit its shape on any grid this plugin may decode."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Grid:
    """The tile grid of one tensor: its logical shape and the (possibly wider) padded shape."""

    rows: int            # N, logical
    cols: int            # K, logical
    padded_rows: int     # a multiple of TILE_ROWS, >= rows
    padded_cols: int     # a multiple of TILE_COLS, >= cols

    @property
    def row_tiles(self) -> int:
        return self.padded_rows // TILE_ROWS

    @property
    def col_tiles(self) -> int:
        return self.padded_cols // TILE_COLS

    @property
    def tiles(self) -> int:
        return self.row_tiles * self.col_tiles

    @property
    def nbytes(self) -> int:
        return self.tiles * CHUNK_BYTES

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def padded_shape(self) -> tuple[int, int]:
        return self.padded_rows, self.padded_cols

    @property
    def wider(self) -> bool:
        """Padded past what the shape needs (a container from a packer that pads to a coarser grid)."""
        return self != tile_grid(self.shape)

    def describe(self) -> str:
        return (f"{self.row_tiles}x{self.col_tiles} tiles of {TILE_ROWS}x{TILE_COLS} for padded shape "
                f"[{self.padded_rows}, {self.padded_cols}]")


def tile_grid(shape: tuple[int, ...], padded_shape: tuple[int, ...] | None = None) -> Grid:
    """The grid of a 2-D weight of numpy shape (N, K); ``padded_shape`` asks for a wider one (it must
    be whole tiles and at least the minimal grid). The one geometry function: the packer and the
    reader both call it."""
    if len(shape) != 2 or min(shape) < 1:
        raise GeometryError(f"packed weights are 2-D with positive sides, not shape {list(shape)}")
    n, k = int(shape[0]), int(shape[1])
    min_rows, min_cols = _ceil(n, TILE_ROWS) * TILE_ROWS, _ceil(k, TILE_COLS) * TILE_COLS
    if padded_shape is None:
        return Grid(n, k, min_rows, min_cols)
    if len(padded_shape) != 2:
        raise GeometryError(f"padded shape {list(padded_shape)} is not 2-D")
    pr, pc = int(padded_shape[0]), int(padded_shape[1])
    if pr % TILE_ROWS or pc % TILE_COLS:
        raise GeometryError(f"padded shape [{pr}, {pc}] is not whole {TILE_ROWS}x{TILE_COLS} tiles")
    if pr < min_rows or pc < min_cols:
        raise GeometryError(f"padded shape [{pr}, {pc}] is narrower than the grid shape {list(shape)} needs "
                            f"([{min_rows}, {min_cols}])")
    return Grid(n, k, pr, pc)


def check_container(name: str, shape: tuple[int, ...], size: int, *, offset: int, where: str = "",
                    padded_shape: tuple[int, ...] | None = None, chunk_kind: str = CHUNK_KIND,
                    chunk_bytes: int = CHUNK_BYTES, version: int = GEOMETRY_VERSION) -> Grid:
    """The grid to decode a stored tensor on, or a GeometryError. ``size`` is the container's byte
    count for the tensor, ``padded_shape`` the grid its manifest declares (None: the minimal one)."""
    at = f"packed tensor '{name}' at offset {offset}" + (f" of {where}" if where else "")
    if version != GEOMETRY_VERSION:
        raise GeometryError(f"{at}: geometry version {version}, this plugin reads version {GEOMETRY_VERSION}")
    if chunk_kind != CHUNK_KIND or chunk_bytes != CHUNK_BYTES:
        raise GeometryError(f"{at}: its chunks are '{chunk_kind}' of {chunk_bytes} bytes, this plugin reads only "
                            f"'{CHUNK_KIND}' of {CHUNK_BYTES} bytes ({TILE_ROWS}x{TILE_COLS} Q4_1 tiles: "
                            f"{GROUPS_PER_TILE} bf16 scales, {GROUPS_PER_TILE} bf16 minimums, {NIBBLE_BYTES} bytes "
                            f"of nibbles); {size} bytes of it would be {size // chunk_bytes if chunk_bytes else 0} "
                            f"chunks of the other kind: refusing to decode them as this kind")
    base = tile_grid(shape)
    declared = None
    if padded_shape is not None and tuple(padded_shape) != base.padded_shape:
        try:
            declared = tile_grid(shape, padded_shape)
        except GeometryError as e:
            raise GeometryError(f"{at}: {size} bytes for shape {list(shape)}: the declared {e}") from None
    grid = declared or base
    if size == grid.nbytes:
        return grid
    valid = [f"{base.nbytes} ({base.describe()}, the shape's own grid)"]
    if declared is not None:
        valid.append(f"{declared.nbytes} ({declared.describe()}, the padded shape the manifest declares)")
    rows_note = ""
    if size % CHUNK_BYTES == 0:
        n_tiles = size // CHUNK_BYTES
        rows_note = f"; {n_tiles} whole tiles, but the grid has {grid.tiles}"
    raise GeometryError(
        f"{at}: {size} bytes do not fit shape {list(shape)}: valid sizes are " + " or ".join(valid)
        + f"; {size} = {size // CHUNK_BYTES} x {CHUNK_BYTES} + {size % CHUNK_BYTES} (remainder {size % CHUNK_BYTES} "
        f"bytes){rows_note}. A wider grid is accepted only when the manifest declares its padded shape and the "
        f"size is exactly tiles x {CHUNK_BYTES}: not decoding on a guess")
