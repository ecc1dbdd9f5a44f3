"""How an agent serves inference: where models are cached and where it listens."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceOptions:
    cache_dir: Path | None = None  # None: a directory of this node's under the system temp
    cache_max_bytes: int = 10 * 1024**3
    host: str = "127.0.0.1"  # where the endpoint listens
    port: int = 0  # 0: any free port (the reported endpoint says which)
    advertise_host: str | None = None  # the host in endpoint URLs; None: derived from host
    max_queue: int = 256  # requests waiting per deployment before 429
    intra_op_threads: int = 0  # ONNX Runtime's intra-op threads per session; 0: its default
    latency_scale: float = 1.0  # simulated devices: reported latency x this

    def resolved_cache_dir(self, node_id: str) -> Path:
        if self.cache_dir is not None:
            return self.cache_dir
        # tempfile imports shutil, bz2 and lzma: an agent that serves no model holds none.
        import tempfile

        return Path(tempfile.gettempdir()) / f"greenfed-models-{node_id}"

    def advertised(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        if self.host in ("0.0.0.0", "::", ""):
            return socket.getfqdn()
        return self.host
