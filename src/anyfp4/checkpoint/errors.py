"""The one error type a checkpoint raises: it always names the file, and the tensor where there is one."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint anyfp4 cannot read, with the file (and tensor) at fault in the message."""

    def __init__(self, message: str, file: str | Path | None = None, tensor: str | None = None):
        self.file = str(file) if file is not None else None
        self.tensor = tensor
        where = []
        if file is not None:
            where.append(f"file {self.file}")
        if tensor is not None:
            where.append(f"tensor {tensor!r}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
