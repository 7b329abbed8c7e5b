"""Node binding of ingest tokens: a bound client speaks only for its own node and jobs.

A node that is compromised can then implicate only itself: it cannot post lines into another
node's streams, and what its lines claim about other hosts is attributed to it (see
`StreamKey.attested` and diagnoser/diagnosis/live.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

JOB_PATTERN = r"^[A-Za-z0-9*?][A-Za-z0-9._:@*?-]{0,252}$"
"""A glob over job ids (`*` and `?`); the other characters are those a job id may hold."""


@dataclass(frozen=True, slots=True)
class Binding:
    node: str | None = None
    jobs: str | None = None
    """A glob such as `train-*`; None: any job."""

    @property
    def bound(self) -> bool:
        return self.node is not None or self.jobs is not None

    def job_problem(self, job_id: str) -> str | None:
        if self.jobs is None or fnmatchcase(job_id, self.jobs):
            return None
        return f"this token may post only for jobs matching {self.jobs!r}, not {job_id!r}"

    def node_problem(self, node: str | None) -> str | None:
        """Why `node` may not be spoken for; None (no node named) is the bound node itself."""
        if self.node is None or node is None or node == self.node:
            return None
        return f"this token is bound to node {self.node!r} and may not speak for {node!r}"

    def stream_problem(self, stream: str | None) -> str | None:
        """A bound node's streams are named after it: `node` or `node/...`."""
        if self.node is None or stream is None:
            return None
        if stream == self.node or stream.startswith(self.node + "/"):
            return None
        return f"this token is bound to node {self.node!r}: stream {stream!r} is not one of its"
