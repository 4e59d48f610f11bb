"""The recorder's index of its history: each caller's key, its group, and where each of
its seals sits in the journal.

The ledger forgets a group once it is published (the replay index then owns it, until
it trains), but the caller may ask for a key's sealed siblings at any time: TRL, resumed
mid-block, regenerates a batch it already trained. The journal keeps every seal, so this
index keeps only where each is (byte offsets) and reads the seal back when asked; it is
built by one pass over the journal when the recorder opens and kept up to date as it
appends. It is a read-side index: the state itself only ever moves through the one
transition of each record (``control.RecordedRun``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidStateError
from ..history import JournalEntry, JournalScan, records
from ._values import SealedSibling, output_from_plain

__all__ = ["KeyEntry", "KeyIndex", "read_seal", "read_seal_version"]


@dataclass(slots=True)
class KeyEntry:
    """One key's group: its prompt digest, aliases, and its seals' places in the journal."""

    key: str
    group_id: str
    prompt_idx: int
    digest: str
    aliases: list[str]
    #: sibling -> (start, end) byte offsets of the line that sealed it.
    seals: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class KeyIndex:
    by_key: dict[str, KeyEntry] = field(default_factory=dict)
    by_group: dict[str, KeyEntry] = field(default_factory=dict)
    #: Rollout id -> (calls, generated tokens) it was handed from a lost attempt.
    inherited: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add(self, entry: KeyEntry) -> None:
        self.by_key[entry.key] = entry
        self.by_group[entry.group_id] = entry

    @classmethod
    def from_journal(cls, entries: Sequence[JournalEntry], end: int) -> KeyIndex:
        """The index of a whole journal (``entries``, verified, whose whole records end at
        byte ``end``)."""
        index = cls()
        ends = [entry.offset for entry in entries[1:]] + [end]
        for entry, stop in zip(entries, ends, strict=True):
            index.fold(entry.record, entry.offset, stop)
        return index

    def fold(self, record: records.HistoryRecord, start: int, end: int) -> None:
        """Take in one record the journal holds at bytes ``[start, end)``."""
        match record:
            case records.PromptTaken(key=str(key), prompt_digest=str(digest)):
                self.add(
                    KeyEntry(
                        key=key,
                        group_id=record.group_id,
                        prompt_idx=record.prompt_idx,
                        digest=digest,
                        aliases=list(record.aliases),
                    )
                )
            case records.PromptAliased():
                self.by_group[record.group_id].aliases.extend(record.aliases)
            case records.SiblingSealed():
                keyed = self.by_group.get(record.group_id)
                if keyed is not None:
                    keyed.seals[record.seal.generation_index] = (start, end)
            case records.AttemptResumed(from_rollout_id=str()):
                self.inherited[record.rollout_id] = (len(record.calls), record.tokens)
            case _:
                pass


def read_seal(journal: Path, where: tuple[int, int], *, group_id: str) -> SealedSibling:
    """The sealed sibling the journal holds at byte range ``where``."""
    seal = _seal_at(journal, where, group_id=group_id)
    output = seal.receipt.get("output")
    if not isinstance(output, dict):
        raise InvalidStateError(
            f"the seal of {seal.rollout_id!r} at byte {where[0]} of {journal.name} holds no "
            "output: not a recorder's seal",
            file=str(journal),
        )
    return output_from_plain(output, sibling=seal.generation_index, rollout_id=seal.rollout_id)


def read_seal_version(journal: Path, where: tuple[int, int], *, group_id: str) -> int:
    """The run's weight version the seal at ``where`` was made at."""
    return max(_seal_at(journal, where, group_id=group_id).weight_versions, default=0)


def _seal_at(journal: Path, where: tuple[int, int], *, group_id: str) -> records.Seal:
    start, end = where
    scan = JournalScan.read(journal, start=start, limit=end)
    record = scan.entries[0].record if len(scan.entries) == 1 else None
    if not isinstance(record, records.SiblingSealed) or record.group_id != group_id:
        raise InvalidStateError(
            f"{journal.name} holds no seal of group {group_id!r} at bytes {start}-{end}: "
            "the journal changed under the recorder",
            file=str(journal),
        )
    return record.seal
