"""Whether a Slurm cluster keeps job accounting, and why its last read failed: the one
rule both back-ends (the commands' `sacct`, slurmrestd's `slurmdb` API) follow.

A read of the accounting comes right after the live listing answered, so a failure
there is slurmdbd's, not the cluster's:

- unreachable, or refused after it once answered: slurmdbd is away. Only live jobs
  are listed this time, and `history_error` says why (the bridge waits for it);
- refused before it ever answered: the cluster keeps no accounting. Nothing is asked
  again, and the live listing (scontrol's window, `MinJobAge`) is all there is.
"""

from __future__ import annotations

import structlog

from cloud.clusters.backend import ClusterRefused, ClusterUnreachable

_log = structlog.get_logger("greenfed.clusters.slurm")


class AccountingReads:
    def __init__(self, source: str) -> None:
        """`source`: who serves the accounting, as the logs name it."""
        self._source = source
        # None: not known yet whether the cluster keeps accounting (no read answered).
        self._kept: bool | None = None
        # Why the last read failed ("": it did not).
        self.history_error = ""

    @property
    def kept_none(self) -> bool:
        """The cluster is known to keep no accounting: nothing to ask."""
        return self._kept is False

    def answered(self) -> None:
        self._kept = True
        self.history_error = ""

    def failed(self, error: ClusterUnreachable | ClusterRefused) -> None:
        if isinstance(error, ClusterUnreachable) or self._kept:
            if not self.history_error:
                _log.warning(
                    "job accounting not read", source=self._source, detail=str(error)[:300]
                )
            self.history_error = str(error)[:500] or type(error).__name__
            return
        if self._kept is None:
            _log.info("no job accounting kept", source=self._source, detail=str(error)[:200])
        self._kept = False
