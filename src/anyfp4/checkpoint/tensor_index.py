"""Lazy access to the tensors of single-file or sharded safetensors checkpoints.

Only headers are read up front (names, dtypes, shapes); a tensor's bytes are read when
it is asked for, from a memory map, so a 70B checkpoint never sits in host memory at once.
Shard files are opened only when they are regular files inside the checkpoint directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .errors import CheckpointError
from .files import inside, read_json_object, regular_file

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: torch.dtype | str  # a torch dtype, or the raw safetensors name when torch has none
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        itemsize = self.dtype.itemsize if isinstance(self.dtype, torch.dtype) else 1
        return n * itemsize


class TensorIndex:
    """Name -> TensorInfo for a checkpoint directory, with lazy ``load(name)``."""

    def __init__(self, checkpoint_dir: str | Path):
        self.root = Path(checkpoint_dir)
        if not self.root.is_dir():
            raise CheckpointError("checkpoint directory does not exist", file=self.root)
        expected = self._index_map()
        self.files = self._shard_files(expected)
        self.infos: dict[str, TensorInfo] = {}
        self._handles: dict[Path, object] = {}
        for file in self.files:
            for info in self._read_header(file):
                if info.name in self.infos:
                    raise CheckpointError(f"tensor stored twice (also in {self.infos[info.name].file.name})",
                                          file=file, tensor=info.name)
                self.infos[info.name] = info
        for name, shard in (expected or {}).items():
            if name not in self.infos:
                raise CheckpointError(f"the index lists this tensor in {shard}, but that shard does not hold it",
                                      file=self.root / shard, tensor=name)

    def _index_map(self) -> dict[str, str] | None:
        path = self.root / INDEX_FILE
        if not regular_file(path):
            return None
        weight_map = read_json_object(path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError("'weight_map' must map tensor names to shard files", file=path)
        for shard in weight_map.values():
            inside(self.root, shard, path)
        return weight_map

    def _shard_files(self, weight_map: dict[str, str] | None) -> list[Path]:
        if weight_map is not None:
            files = []
            for shard in dict.fromkeys(weight_map.values()):
                path = self.root / shard
                if not regular_file(path):
                    example = next(n for n, s in weight_map.items() if s == shard)
                    raise CheckpointError(f"shard listed in {INDEX_FILE} is missing", file=path, tensor=example)
                files.append(path)
            return files
        single = self.root / SINGLE_FILE
        if regular_file(single):
            return [single]
        found = sorted(p for p in self.root.glob("*.safetensors") if regular_file(p))
        if not found:
            raise CheckpointError("no safetensors weights found (model.safetensors or an index)", file=self.root)
        return found

    def _read_header(self, file: Path) -> list[TensorInfo]:
        handle = self._open(file)
        infos = []
        try:
            for name in handle.keys():
                sl = handle.get_slice(name)
                raw = sl.get_dtype()
                infos.append(TensorInfo(name, file, SAFETENSORS_DTYPES.get(raw, raw), tuple(sl.get_shape())))
        except (SafetensorError, OSError, RuntimeError, ValueError, TypeError) as e:
            raise CheckpointError(f"corrupt safetensors header: {e}", file=file) from None
        return infos

    def _open(self, file: Path):
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(str(file), framework="pt")
            except (SafetensorError, OSError, RuntimeError, ValueError) as e:
                raise CheckpointError(f"corrupt or truncated safetensors file: {e}", file=file) from None
        return self._handles[file]

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def __getitem__(self, name: str) -> TensorInfo:
        return self.infos[name]

    def names(self) -> list[str]:
        return list(self.infos)

    def load(self, name: str) -> torch.Tensor:
        info = self.infos.get(name)
        if info is None:
            raise CheckpointError("tensor not found in the checkpoint", file=self.root, tensor=name)
        try:
            return self._open(info.file).get_tensor(name)
        except (SafetensorError, OSError, RuntimeError, ValueError, TypeError) as e:
            raise CheckpointError(f"could not read tensor data: {e}", file=info.file, tensor=name) from None
