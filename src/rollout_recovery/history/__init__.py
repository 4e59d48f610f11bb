"""The typed durable history of a run: its records, the trail that appends them, the
checker of the invariants they must satisfy, and the read-only auditor.

Every record is a msgspec Struct of one tagged union (:data:`HistoryRecord`); writers
append Structs and readers decode into the union, refusing a line that is not a record
with its ``file:line``.
"""

from ._auditor import audit_run
from ._journal import JournalEntry, JournalScan, JournalWriter, cut_torn_tail, scan_journal
from ._journal_report import RECORD_TYPES, JournalReport, inspect_journal
from ._records import (
    AbandonedAttempt,
    AttemptResumed,
    AttemptsAbandoned,
    BackendEvent,
    BatchAdmitted,
    CheckpointCommitted,
    DiscardedSeal,
    DropReason,
    FreshAttempt,
    GroupPublished,
    GroupSealed,
    HistoryRecord,
    PromptDropped,
    PromptTaken,
    Restored,
    ReusePolicy,
    RewardChecksRecord,
    RoundStarted,
    RunStarted,
    Seal,
    SiblingSealed,
    StepTrained,
    TrainedRow,
)
from ._trail import AuditTrail
from ._trail_reader import TrailLineError, read_json_lines, read_records

__all__ = [
    "RECORD_TYPES",
    "AbandonedAttempt",
    "AttemptResumed",
    "AttemptsAbandoned",
    "AuditTrail",
    "BackendEvent",
    "BatchAdmitted",
    "CheckpointCommitted",
    "DiscardedSeal",
    "DropReason",
    "FreshAttempt",
    "GroupPublished",
    "GroupSealed",
    "HistoryRecord",
    "JournalEntry",
    "JournalReport",
    "JournalScan",
    "JournalWriter",
    "PromptDropped",
    "PromptTaken",
    "Restored",
    "ReusePolicy",
    "RewardChecksRecord",
    "RoundStarted",
    "RunStarted",
    "Seal",
    "SiblingSealed",
    "StepTrained",
    "TrailLineError",
    "TrainedRow",
    "audit_run",
    "cut_torn_tail",
    "inspect_journal",
    "read_json_lines",
    "read_records",
    "scan_journal",
]
