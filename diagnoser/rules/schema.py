"""The rule file schema: strict, frozen pydantic models and the shared failure vocabulary.

The vocabulary mirrors docs/failure-taxonomy.md; a test keeps the two in step.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

EXCEPTION_TEMPLATE = "{exception}"
"""A failure type spelled this way takes the exception type captured by the rule's pattern."""


class Category(StrEnum):
    HARDWARE = "hardware"
    NETWORK = "network"
    STORAGE = "storage"
    FRAMEWORK = "framework"
    USER_CODE = "user_code"
    RESOURCE = "resource"


class Action(StrEnum):
    CORDON_NODE_AND_RESTART = "cordon_node_and_restart"
    RESTART_JOB = "restart_job"
    NOTIFY_USER = "notify_user"
    ESCALATE = "escalate"
    NONE = "none"


class Severity(StrEnum):
    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Scope(StrEnum):
    NODE = "node"
    """The node that emitted the line is the culprit."""
    JOB = "job"


class Unit(StrEnum):
    """What a rule's patterns are matched against."""

    LINE = "line"
    TRACEBACK = "traceback"
    """The final exception line of an assembled Python traceback (frames are evidence)."""
    CHILD_FAILED = "child_failed"
    """The summary `exitcode=N signal=NAME` of a torchrun ChildFailedError root cause."""
    NCCL_ERROR = "nccl_error"
    """The lines of one NCCL error report (headline, ncclXxxError, `Last error:` detail)."""
    ECC_SECTION = "ecc_section"
    """The counters of an `nvidia-smi -q` ECC section under its `Double Bit` header (the
    pre-R450 layout, where a count's meaning is in the header above it), as `Field: value`."""
    QUERY_CSV = "query_csv"
    """The rows of `nvidia-smi --query-gpu=<fields> --format=csv` under their header (a value's
    meaning is in its column), as one `[gpu <index>] <field>: <value>` line per cell."""


_FT = tuple[Category, Action]
FAILURE_TYPES: dict[str, _FT] = {
    "gpu_fallen_off_bus": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "gpu_ecc_uncorrectable": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "gpu_row_remap_failure": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "gpu_ecc_contained": (Category.HARDWARE, Action.RESTART_JOB),
    "gsp_error": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "nvlink_error": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "gpu_xid_fatal": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "gpu_xid_application": (Category.FRAMEWORK, Action.RESTART_JOB),
    "gpu_xid_repeated_same_gpu": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "gpu_xid_informational": (Category.HARDWARE, Action.NONE),
    "gpu_xid_unknown": (Category.HARDWARE, Action.ESCALATE),
    "gpu_recovery_action": (Category.HARDWARE, Action.ESCALATE),
    "gpu_lost": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "gpu_health_failure": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "ib_host_fault": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "nvml_driver_mismatch": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "pcie_fatal_error": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "host_hardware_error": (Category.HARDWARE, Action.CORDON_NODE_AND_RESTART),
    "host_kernel_fault": (Category.HARDWARE, Action.ESCALATE),
    "nccl_timeout": (Category.NETWORK, Action.RESTART_JOB),
    "nccl_remote_error": (Category.NETWORK, Action.RESTART_JOB),
    "nccl_system_error": (Category.NETWORK, Action.RESTART_JOB),
    "nccl_internal_error": (Category.FRAMEWORK, Action.ESCALATE),
    "nccl_transport_error": (Category.NETWORK, Action.RESTART_JOB),
    "ib_error": (Category.NETWORK, Action.RESTART_JOB),
    "socket_closed": (Category.NETWORK, Action.RESTART_JOB),
    "rendezvous_error": (Category.NETWORK, Action.RESTART_JOB),
    "auxiliary_service_error": (Category.NETWORK, Action.NOTIFY_USER),
    "nccl_shm_error": (Category.RESOURCE, Action.NOTIFY_USER),
    "shm_exhausted": (Category.RESOURCE, Action.NOTIFY_USER),
    "too_many_open_files": (Category.RESOURCE, Action.NOTIFY_USER),
    "process_limit": (Category.RESOURCE, Action.NOTIFY_USER),
    "memlock_limit": (Category.RESOURCE, Action.NOTIFY_USER),
    "ephemeral_storage_eviction": (Category.RESOURCE, Action.NOTIFY_USER),
    "time_limit": (Category.RESOURCE, Action.NOTIFY_USER),
    "preempted": (Category.RESOURCE, Action.RESTART_JOB),
    "unschedulable": (Category.RESOURCE, Action.NOTIFY_USER),
    "nccl_cuda_oom": (Category.RESOURCE, Action.NOTIFY_USER),
    "cuda_oom": (Category.RESOURCE, Action.NOTIFY_USER),
    "host_oom": (Category.RESOURCE, Action.NOTIFY_USER),
    "dataloader_killed": (Category.RESOURCE, Action.NOTIFY_USER),
    "process_killed": (Category.RESOURCE, Action.ESCALATE),
    "host_memory_phase": (Category.RESOURCE, Action.NONE),
    "disk_full": (Category.STORAGE, Action.NOTIFY_USER),
    "object_store_error": (Category.STORAGE, Action.RESTART_JOB),
    "nfs_error": (Category.STORAGE, Action.RESTART_JOB),
    "storage_io_error": (Category.STORAGE, Action.ESCALATE),
    "illegal_memory_access": (Category.USER_CODE, Action.NOTIFY_USER),
    "device_side_assert": (Category.USER_CODE, Action.NOTIFY_USER),
    "startup_error": (Category.USER_CODE, Action.NOTIFY_USER),
    "nan_loss": (Category.USER_CODE, Action.NOTIFY_USER),
    "loss_spike": (Category.USER_CODE, Action.NOTIFY_USER),
    "<ExceptionType>": (Category.USER_CODE, Action.NOTIFY_USER),
    "segfault": (Category.FRAMEWORK, Action.ESCALATE),
    "cuda_error": (Category.FRAMEWORK, Action.ESCALATE),
    "xla_execution_failed": (Category.FRAMEWORK, Action.ESCALATE),
    "worker_process_failed": (Category.FRAMEWORK, Action.ESCALATE),
    "abnormal_exit": (Category.FRAMEWORK, Action.ESCALATE),
    "fatal_signal": (Category.FRAMEWORK, Action.ESCALATE),
    "gpu_fault": (Category.FRAMEWORK, Action.ESCALATE),
    "unexplained_traceback": (Category.FRAMEWORK, Action.ESCALATE),
    "communicator_aborted": (Category.NETWORK, Action.ESCALATE),
    "hang": (Category.FRAMEWORK, Action.RESTART_JOB),
    "extension_build_lock": (Category.FRAMEWORK, Action.NOTIFY_USER),
}
"""failure_type -> (category, default action), per docs/failure-taxonomy.md (`healthy` omitted)."""

ACTION_STRICTNESS: dict[Action, int] = {
    Action.NONE: 0,
    Action.NOTIFY_USER: 1,
    Action.RESTART_JOB: 2,
    Action.ESCALATE: 3,
    Action.CORDON_NODE_AND_RESTART: 4,
}
"""How much a recovery action does; a rule looser than its type's default must say why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class Window(_Strict):
    """Fire only when `count` matches fall within `seconds` (job-wide, across streams).

    `same` names the fields that must agree (`node`, `rank` or a named group such as `pci`):
    counts are kept per distinct value. `distinct` instead counts different values of one field
    (e.g. the same Xid on 2 different GPUs).
    """

    count: Annotated[int, Field(ge=2, le=1000)]
    seconds: Annotated[float, Field(gt=0, le=7 * 86400)]
    same: tuple[str, ...] = ()
    distinct: str | None = None


class Relation(_Strict):
    """A set of other events, named by rule id, failure type or category."""

    rules: tuple[str, ...] = ()
    failure_types: tuple[str, ...] = ()
    categories: tuple[Category, ...] = ()

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if not (self.rules or self.failure_types or self.categories):
            raise ValueError("a relation names at least one rule, failure type or category")
        return self


class Examples(_Strict):
    """Real strings (a line, or several for multi-line units) the rule must / must not fire on."""

    match: Annotated[tuple[str, ...], Field(min_length=1)]
    no_match: Annotated[tuple[str, ...], Field(min_length=1)]


class Rule(_Strict):
    id: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=80)]
    description: Annotated[str, Field(min_length=10)]
    failure_type: Annotated[str, Field(min_length=1)]
    category: Category
    severity: Severity
    scope: Scope
    action: Action
    action_reason: str | None = None
    """Required when `action` is looser than the failure type's default action."""
    action_from: str | None = None
    """A named group whose captured text states the action (Xid 154); see `action_map`."""
    action_map: dict[str, Action] = Field(default_factory=dict)
    unit: Unit = Unit.LINE
    patterns: Annotated[tuple[str, ...], Field(min_length=1)]
    requires: tuple[str, ...] = ()
    """Multi-line units only: regexes that must also be found somewhere in the block's lines."""
    ignore_case: bool = False
    anchors: tuple[str, ...] | None = None
    """Literal strings, one of which every matching line contains (prefilter); derived if unset."""
    fallback: bool = False
    """Fire only when no non-fallback rule fired on the same line or block."""
    headless: bool = False
    """Fallback traceback rules only: also see an exception line whose traceback header is
    missing (other fallback rules never do; specific ones always do)."""
    window: Window | None = None
    symptom_of: Relation | None = None
    overrides: Relation | None = None
    examples: Examples

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.failure_type == EXCEPTION_TEMPLATE:
            if self.category is not Category.USER_CODE and self.category is not Category.FRAMEWORK:
                raise ValueError("exception-typed rules are user_code or framework")
        elif self.failure_type not in FAILURE_TYPES:
            raise ValueError(
                f"failure_type {self.failure_type!r} is not in docs/failure-taxonomy.md"
            )
        else:
            category, default = FAILURE_TYPES[self.failure_type]
            if category is not self.category:
                raise ValueError(
                    f"failure_type {self.failure_type!r} belongs to category {category.value!r}"
                )
            looser = ACTION_STRICTNESS[self.action] < ACTION_STRICTNESS[default]
            if looser and not self.action_reason:
                raise ValueError(
                    f"action {self.action.value!r} is looser than the default {default.value!r} "
                    "of its failure type: say why in action_reason"
                )
        if self.action_map and not self.action_from:
            raise ValueError("action_map needs action_from")
        if self.action_from and not self.action_map:
            raise ValueError("action_from needs action_map")
        if self.headless and not (self.fallback and self.unit is Unit.TRACEBACK):
            raise ValueError("headless applies to fallback traceback rules only")
        if self.requires and self.unit is Unit.LINE:
            raise ValueError("requires applies to multi-line units only")
        if self.anchors is not None and self.unit is not Unit.LINE:
            raise ValueError("anchors apply to line rules only (blocks have built-in triggers)")
        if self.window and self.window.distinct and self.window.distinct in self.window.same:
            raise ValueError("window.distinct cannot also be in window.same")
        return self


class RuleFile(_Strict):
    """One `rules/*.yaml` file: a failure family."""

    family: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
    description: Annotated[str, Field(min_length=10)]
    rules: Annotated[tuple[Rule, ...], Field(min_length=1)]


def json_schema() -> str:
    """The JSON Schema of a rule file, as committed in rules/schema.json."""
    schema = RuleFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "diagnoser rule file"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
