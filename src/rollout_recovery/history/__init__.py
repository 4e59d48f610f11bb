"""The typed durable history of a run: its records, the trail that appends them, the
checker of the invariants they must satisfy, and the read-only auditor.

Every record is a msgspec Struct of one tagged union (``records.HistoryRecord``); the
public schema module :mod:`rollout_recovery.history.records` holds them all. Writers
append Structs and readers decode into the union, refusing a line that is not a record
with its ``file:line``.
"""

from . import records
from ._auditor import audit_run
from ._journal import JournalEntry, JournalScan
from ._journal_report import JournalReport
from ._trail import AuditTrail

__all__ = [
    "AuditTrail",
    "JournalEntry",
    "JournalReport",
    "JournalScan",
    "audit_run",
    "records",
]
