"""Safe access to COLMAP models: validate binary model files before pycolmap reads them, import pycolmap safely.

Why validate: pycolmap's binary readers trust the counts they read. A truncated ``points3D.bin`` makes its reader
take garbage for a track length and allocate without bound (gigabytes in seconds, no output); truncated
``images.bin`` / ``cameras.bin`` give errors naming no file. :func:`validate_binary_model` walks each file's
records with the sizes its counts declare, against the bytes that are there, without allocating anything by those
counts, and raises a ValueError naming the file, the record and what is wrong. It reads each file once (memory
bounded by the file's size).

Why a helper to import pycolmap: importing pycolmap installs glog's native failure handler on SIGTERM, SIGSEGV,
SIGABRT, SIGBUS, SIGILL and SIGFPE, so a training process killed by torchrun prints a native stack trace and once
deadlocked in it. :func:`import_pycolmap` restores the previous native handlers right after the import.
"""

from __future__ import annotations

import ctypes
import signal
import struct
import sys
from pathlib import Path
from types import ModuleType

CAMERA_MODEL_PARAMS = {
    0: 3, 1: 4, 2: 4, 3: 5, 4: 8, 5: 8, 6: 12, 7: 5, 8: 4, 9: 5, 10: 12, 11: 16, 12: 4, 13: 5, 14: 3, 15: 4,
    16: 6, 17: 2,
}  # fmt: skip
"""Number of parameters of each COLMAP camera model id (pycolmap 4's CameraModelId)."""

GLOG_SIGNALS = (signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)
"""The signals glog's failure handler takes over when pycolmap is imported."""

_SIGACTION_BYTES = 256
"""Room for a native ``struct sigaction`` (152 bytes on x86-64 and aarch64 glibc), kept opaque."""

_CAMERA = struct.Struct("<IiQQ")  # camera_id, model_id, width, height; then params doubles
_IMAGE = struct.Struct("<I4d3dI")  # image_id, qvec, tvec, camera_id; then name\0, num_points2D, points2D
_POINT2D_BYTES = 24  # x, y (double), point3D_id (int64)
_POINT3D = struct.Struct("<Q3d3BdQ")  # point3D_id, xyz, rgb, error, track_length; then track
_TRACK_ELEMENT_BYTES = 8  # image_id, point2D_idx (uint32)
_COUNT = struct.Struct("<Q")


def import_pycolmap() -> ModuleType:
    """pycolmap, imported with the process's native handlers of :data:`GLOG_SIGNALS` kept as they were.

    Every module of this package imports pycolmap through this function, so training processes keep Python's
    (or the default) SIGTERM handling: a stopped run ends quietly instead of printing a native stack trace.
    """
    if "pycolmap" in sys.modules:
        return sys.modules["pycolmap"]
    libc = ctypes.CDLL(None, use_errno=True)
    saved = {}
    for signum in GLOG_SIGNALS:
        action = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if libc.sigaction(int(signum), None, action) == 0:
            saved[signum] = action
    import pycolmap

    for signum, action in saved.items():
        libc.sigaction(int(signum), action, None)
    return pycolmap


def validate_binary_model(sparse_dir: Path) -> None:
    """Check that the binary files of the COLMAP model in ``sparse_dir`` hold every record their counts declare.

    Files present as ``.bin`` are checked (cameras, images, points3D); text models are left to pycolmap.

    Raises:
        ValueError: a file is truncated, has bytes after its last record, or names an unknown camera model; the
            message names the file and the record.
    """
    for stem, check in (("cameras", _check_cameras), ("images", _check_images), ("points3D", _check_points3D)):
        path = Path(sparse_dir) / f"{stem}.bin"
        if path.is_file():
            check(_Reader(path))


class _Reader:
    """Bounds-checked sequential reads of one model file; every error names the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = path.read_bytes()
        self.offset = 0

    def remaining(self) -> int:
        return len(self.data) - self.offset

    def fail(self, problem: str) -> ValueError:
        return ValueError(
            f"COLMAP model file {self.path} ({len(self.data)} bytes) is corrupt: {problem}. "
            "It was probably truncated by an interrupted copy or write; copy it again or re-export the model "
            "(colmap model_converter)."
        )

    def skip(self, size: int, what: str) -> None:
        if size > self.remaining():
            raise self.fail(f"{what} needs {size} bytes at offset {self.offset}, only {self.remaining()} remain")
        self.offset += size

    def unpack(self, layout: struct.Struct, what: str) -> tuple:
        start = self.offset
        self.skip(layout.size, what)
        return layout.unpack_from(self.data, start)

    def count(self, record: str, smallest_record: int) -> int:
        """The file's leading record count, refused when even records of ``smallest_record`` bytes cannot fit."""
        (count,) = self.unpack(_COUNT, f"the count of {record}s")
        if count * smallest_record > self.remaining():
            raise self.fail(
                f"its header declares {count} {record}s of at least {smallest_record} bytes each, but only "
                f"{self.remaining()} bytes follow"
            )
        return count

    def finish(self, count: int, record: str) -> None:
        if self.remaining():
            raise self.fail(f"{self.remaining()} bytes follow its {count} {record}s")


def _check_cameras(reader: _Reader) -> None:
    """cameras.bin: count, then per camera its id, model id, width, height and the model's parameters."""
    count = reader.count("camera", _CAMERA.size)
    for index in range(count):
        camera_id, model_id, _, _ = reader.unpack(_CAMERA, f"camera {index} of {count}")
        if model_id not in CAMERA_MODEL_PARAMS:
            raise reader.fail(f"camera {index} of {count} (id {camera_id}) has unknown model id {model_id}")
        reader.skip(8 * CAMERA_MODEL_PARAMS[model_id], f"the parameters of camera {index} of {count} (id {camera_id})")
    reader.finish(count, "cameras")


def _check_images(reader: _Reader) -> None:
    """images.bin: count, then per image its id, pose, camera id, name, and its 2D points."""
    count = reader.count("image", _IMAGE.size + 1 + _COUNT.size)
    for index in range(count):
        image_id = reader.unpack(_IMAGE, f"image {index} of {count}")[0]
        end = reader.data.find(b"\0", reader.offset)
        if end < 0:
            raise reader.fail(f"the name of image {index} of {count} (id {image_id}) has no terminating NUL")
        reader.offset = end + 1
        (points,) = reader.unpack(_COUNT, f"the 2D point count of image {index} of {count} (id {image_id})")
        reader.skip(points * _POINT2D_BYTES, f"the {points} 2D points of image {index} of {count} (id {image_id})")
    reader.finish(count, "images")


def _check_points3D(reader: _Reader) -> None:
    """points3D.bin: count, then per point its id, position, colour, error and its track."""
    count = reader.count("3D point", _POINT3D.size)
    for index in range(count):
        values = reader.unpack(_POINT3D, f"3D point {index} of {count}")
        point_id, length = values[0], values[-1]
        reader.skip(length * _TRACK_ELEMENT_BYTES, f"the track of {length} observations of 3D point {index} of {count} (id {point_id})")
    reader.finish(count, "3D points")
