"""The replay index: which canonical groups exist, which step they train on, who claimed them.

Lifecycle of one group slot::

    reserve -> (abort) | commit -> ready -> claim(step) -> clear      (rows removed)
                                       \\-> evict                       (rows removed)
                                  claim -> release -> ready

The rows themselves live in the data plane's canonical partition (the finalizer puts them);
the index owns their keys. Every mutation takes the caller's barrier cut and checks it
first, so a checkpoint never sees a half-applied change, and a refused call changes nothing.
Not thread-safe: it lives on the controller's event loop.

Only committed groups are persisted. Unready reservations are omitted because the ledger
still owns those prompts, and a claim is persisted as a plain ready group: a checkpoint
taken while a training step is open holds the weights from before that step, so a restart
must train those groups again.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import msgspec

from .._checks import refuse_bare_string
from .._cut import MutationCut
from .._messages import format_keys, split_validation_path
from ..errors import (
    InvalidArgumentError,
    InvalidStateError,
    InvalidTransitionError,
    UnknownGroupError,
)
from ._protocol import DataPlane

__all__ = ["CANONICAL_PARTITION", "ReplayGroup", "ReplayIndex"]

CANONICAL_PARTITION = "canonical"
_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayGroup:
    """A committed group: its N canonical row keys (generation order) and scheduling facts.

    ``metrics`` are the finalizer's metrics for logging, owned here (the sidecar's copy is
    derived from :meth:`ReplayIndex.metrics_by_group`); saved but not digested.
    """

    group_id: str
    row_keys: tuple[str, ...]
    target_step: int
    min_weight_version: int
    max_weight_version: int
    claimed_step: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)


class _GroupState(msgspec.Struct, forbid_unknown_fields=True):
    group_id: str
    row_keys: list[str]
    target_step: int
    min_weight_version: int
    max_weight_version: int
    metrics: dict[str, float] = {}


class _IndexState(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: int
    partition: str
    group_size: int
    digest: str
    groups: list[_GroupState]


def _digest(partition: str, group_size: int, groups: Iterable[_GroupState]) -> str:
    """SHA-256 over the identity of the committed groups.

    Groups are sorted by id and dict keys are sorted by the encoder, so neither the order
    groups were committed in nor the key order of a hand-built state changes the digest;
    metrics are left out because they are logging, not ownership.
    """
    entries = sorted(map(_digested, groups), key=lambda entry: str(entry["group_id"]))
    return _digest_of_encoded(partition, group_size, entries)


def _digested(group: _GroupState) -> dict[str, Any]:
    """What the digest covers of one group."""
    return {
        "group_id": group.group_id,
        "row_keys": list(group.row_keys),
        "target_step": group.target_step,
        "min_weight_version": group.min_weight_version,
        "max_weight_version": group.max_weight_version,
    }


def _digest_of_encoded(
    partition: str, group_size: int, groups: Sequence[dict[str, Any] | msgspec.Raw]
) -> str:
    """:func:`_digest` of the groups' digest entries in id order, each a dict or its JSON
    (``Raw``, inserted as it is: the same bytes)."""
    canonical = {
        "schema_version": _SCHEMA_VERSION,
        "partition": partition,
        "group_size": group_size,
        "groups": groups,
    }
    return hashlib.sha256(_JSON.encode(canonical)).hexdigest()


def _saved(group: ReplayGroup) -> _GroupState:
    return _GroupState(
        group_id=group.group_id,
        row_keys=list(group.row_keys),
        target_step=group.target_step,
        min_weight_version=group.min_weight_version,
        max_weight_version=group.max_weight_version,
        metrics=dict(group.metrics),
    )


_JSON = msgspec.json.Encoder(order="sorted")
_MSGPACK = msgspec.msgpack.Encoder()


def _check_int(value: object, name: str, group_id: str, *, minimum: int = 0) -> int:
    if type(value) is not int or value < minimum:
        raise InvalidTransitionError(
            f"group {group_id!r}: {name} must be an int >= {minimum}, got {value!r}",
            group_id=group_id,
        )
    return value


class ReplayIndex:
    """Committed canonical groups, indexed for the train pump; rows live in ``data_plane``."""

    # The partition canonical rows live in (by default): the one stores, the auditor and
    # the restore inventory read them from.
    canonical_partition: ClassVar[str] = CANONICAL_PARTITION

    def __init__(
        self, *, data_plane: DataPlane, group_size: int, partition: str = CANONICAL_PARTITION
    ) -> None:
        if type(group_size) is not int or group_size < 1:
            raise InvalidArgumentError(f"group_size must be an int >= 1, got {group_size!r}")
        self._data_plane = data_plane
        self._group_size = group_size
        self._partition = partition
        self._reserved: set[str] = set()
        self._groups: dict[str, ReplayGroup] = {}
        self._owner: dict[str, str] = {}  # canonical row key -> group id
        # Each committed group's saved entry and digest entry, encoded on the first
        # :meth:`encoded_state` after its commit (a claim changes neither).
        self._encoded: dict[str, tuple[msgspec.Raw, msgspec.Raw]] = {}

    # ---- reading ---------------------------------------------------------------------

    @property
    def group_size(self) -> int:
        return self._group_size

    @property
    def partition(self) -> str:
        return self._partition

    def __len__(self) -> int:
        """Number of committed groups (claimed ones included)."""
        return len(self._groups)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._groups

    def group(self, group_id: str) -> ReplayGroup:
        try:
            return self._groups[group_id]
        except KeyError:
            raise UnknownGroupError(
                f"replay index has no committed group {group_id!r}", group_id=group_id
            ) from None

    def group_ids(self) -> list[str]:
        """Committed group ids, sorted."""
        return sorted(self._groups)

    def reserved_group_ids(self) -> list[str]:
        return sorted(self._reserved)

    def ready_groups(self, target_step: int | None = None) -> list[ReplayGroup]:
        """Committed, unclaimed groups (for ``target_step`` if given), sorted by id."""
        return [
            group
            for _, group in sorted(self._groups.items())
            if group.claimed_step is None
            and (target_step is None or group.target_step == target_step)
        ]

    def row_keys(self) -> list[str]:
        """Every canonical row key the index owns, sorted."""
        return sorted(self._owner)

    def metrics_by_group(self) -> dict[str, dict[str, float]]:
        """Each committed group's finalizer metrics (fresh dicts), by group id.

        The index owns finalizer metrics: they are committed with the group's rows, under
        the same cut, and leave with them. The sidecar's ``finalizer_metrics_by_group``
        (NeMo-RL's field) is written from this at each checkpoint, never kept apart.
        """
        return {group_id: dict(group.metrics) for group_id, group in sorted(self._groups.items())}

    # ---- mutations -------------------------------------------------------------------

    def reserve(self, cut: MutationCut, group_id: str) -> None:
        """Open an unready slot for ``group_id`` (before its rows exist)."""
        cut.require_live()
        if not isinstance(group_id, str) or not group_id:
            raise InvalidTransitionError(f"group_id must be a non-empty str, got {group_id!r}")
        if group_id in self._reserved or group_id in self._groups:
            raise InvalidTransitionError(
                f"duplicate live group_id={group_id!r} in the replay index", group_id=group_id
            )
        self._reserved.add(group_id)

    def commit(
        self,
        cut: MutationCut,
        group_id: str,
        row_keys: Sequence[str],
        *,
        target_step: int,
        min_weight_version: int,
        max_weight_version: int,
        metrics: Mapping[str, float] | None = None,
    ) -> ReplayGroup:
        """Make a reserved slot ready with its N canonical row keys (already put by the
        finalizer under the same cut). ``min_weight_version`` is the group's oldest call
        version, which staleness accounting uses."""
        cut.require_live()
        if group_id not in self._reserved:
            state = "already committed" if group_id in self._groups else "not reserved"
            raise InvalidTransitionError(
                f"cannot commit group {group_id!r}: it has no unready slot ({state})",
                group_id=group_id,
            )
        keys = self.check_commit(
            group_id,
            row_keys,
            target_step=target_step,
            min_weight_version=min_weight_version,
            max_weight_version=max_weight_version,
            metrics=metrics,
        )
        group = ReplayGroup(
            group_id=group_id,
            row_keys=keys,
            target_step=target_step,
            min_weight_version=min_weight_version,
            max_weight_version=max_weight_version,
            metrics=self._check_metrics(group_id, metrics),
        )
        self._reserved.discard(group_id)
        self._groups[group_id] = group
        self._owner.update(dict.fromkeys(keys, group_id))
        return group

    def check_commit(
        self,
        group_id: str,
        row_keys: Sequence[str],
        *,
        target_step: int,
        min_weight_version: int,
        max_weight_version: int,
        metrics: Mapping[str, float] | None = None,
    ) -> tuple[str, ...]:
        """Every check of :meth:`commit` but the slot's, with no effect; returns the keys.

        The finalizer runs this before it writes canonical rows: a refusal after the
        write would leave the group's outcome unknown, which is fatal.
        """
        if group_id in self._groups:
            raise InvalidTransitionError(
                f"cannot commit group {group_id!r}: it is already committed", group_id=group_id
            )
        refuse_bare_string(row_keys, what="row_keys", operation="commit")
        keys = tuple(row_keys)
        if len(keys) != self._group_size:
            raise InvalidTransitionError(
                f"group {group_id!r} commits {len(keys)} row keys, expected exactly "
                f"{self._group_size}",
                group_id=group_id,
            )
        bad = [key for key in keys if not isinstance(key, str) or not key]
        if bad:
            raise InvalidTransitionError(
                f"group {group_id!r}: row keys must be non-empty str, got {bad[:10]!r}",
                group_id=group_id,
            )
        duplicates = sorted(key for key, count in Counter(keys).items() if count > 1)
        if duplicates:
            raise InvalidTransitionError(
                f"group {group_id!r} repeats row keys {format_keys(duplicates)}",
                group_id=group_id,
            )
        taken = [key for key in keys if key in self._owner]
        if taken:
            raise InvalidTransitionError(
                f"group {group_id!r}: row keys already owned by other groups: {format_keys(taken)}",
                group_id=group_id,
            )
        _check_int(target_step, "target_step", group_id)
        _check_int(min_weight_version, "min_weight_version", group_id)
        _check_int(max_weight_version, "max_weight_version", group_id, minimum=min_weight_version)
        self._check_metrics(group_id, metrics)
        return keys

    def abort(self, cut: MutationCut, group_id: str) -> bool:
        """Drop an unready slot; ``False`` for a committed or unknown group (so cleanup
        paths may call it blindly). The caller owns any row cleanup."""
        cut.require_live()
        if group_id not in self._reserved:
            return False
        self._reserved.discard(group_id)
        return True

    def claim(self, cut: MutationCut, step: int, group_ids: Sequence[str]) -> list[ReplayGroup]:
        """Mark ready groups as consumed by train step ``step``; all or nothing."""
        cut.require_live()
        ids = self._existing(group_ids, "claim")
        if type(step) is not int or step < 0:
            raise InvalidTransitionError(f"train step must be an int >= 0, got {step!r}")
        claimed = [gid for gid in ids if self._groups[gid].claimed_step is not None]
        if claimed:
            raise InvalidTransitionError(
                f"cannot claim groups already claimed by a train step: {format_keys(claimed)}",
                group_id=claimed[0],
            )
        for gid in ids:
            self._groups[gid] = replace(self._groups[gid], claimed_step=step)
        return [self._groups[gid] for gid in ids]

    def release(self, cut: MutationCut, group_ids: Sequence[str]) -> None:
        """Return claimed groups to ready (their train step did not complete)."""
        cut.require_live()
        ids = self._claimed(group_ids, "release")
        for gid in ids:
            self._groups[gid] = replace(self._groups[gid], claimed_step=None)

    def clear(self, cut: MutationCut, group_ids: Sequence[str]) -> None:
        """Forget trained (claimed) groups and remove their rows from the data plane.

        Rows are cleared first: if the data plane fails, the index keeps owning them and
        the call may be retried (clearing is idempotent)."""
        cut.require_live()
        self._remove(cut, self._claimed(group_ids, "clear"))

    def evict(self, cut: MutationCut, group_ids: Sequence[str]) -> None:
        """Forget ready, unclaimed groups that will never train (for example too stale)
        and remove their rows; recording why is the caller's job."""
        cut.require_live()
        ids = self._existing(group_ids, "evict")
        claimed = [gid for gid in ids if self._groups[gid].claimed_step is not None]
        if claimed:
            raise InvalidTransitionError(
                f"cannot evict groups claimed by a train step: {format_keys(claimed)}",
                group_id=claimed[0],
            )
        self._remove(cut, ids)

    # ---- persistence -----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain, msgspec-friendly metadata of the committed groups, with its digest."""
        groups = [_saved(group) for _, group in sorted(self._groups.items())]
        state = _IndexState(
            schema_version=_SCHEMA_VERSION,
            partition=self._partition,
            group_size=self._group_size,
            digest=_digest(self._partition, self._group_size, groups),
            groups=groups,
        )
        result: dict[str, Any] = msgspec.to_builtins(state)
        return result

    def encoded_state(self) -> bytes:
        """``msgspec.msgpack.encode(self.state_dict())``, encoding only the groups
        committed since the last call (each group's entries are kept until it leaves).

        What stays O(committed groups), in C: sorting the ids, joining the entries and the
        digest's SHA-256 over its JSON.
        """
        encoded = self._encoded
        for group_id in self._groups.keys() - encoded.keys():
            saved = _saved(self._groups[group_id])
            encoded[group_id] = (
                msgspec.Raw(_MSGPACK.encode(saved)),
                msgspec.Raw(_JSON.encode(_digested(saved))),
            )
        ordered = [encoded[group_id] for group_id in sorted(self._groups)]
        digest = _digest_of_encoded(
            self._partition, self._group_size, [entry for _, entry in ordered]
        )
        state = _IndexState(
            schema_version=_SCHEMA_VERSION,
            partition=self._partition,
            group_size=self._group_size,
            digest=digest,
            groups=[entry for entry, _ in ordered],  # type: ignore[misc]
        )
        return _MSGPACK.encode(state)

    @staticmethod
    def saved_groups(state: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
        """The row keys each group of a saved :meth:`state_dict` owns, without a data plane.

        Checks the schema and the digest like :meth:`from_state_dict` (for readers such as
        the auditor, which only need ownership). Raises :class:`InvalidStateError`.
        """
        parsed = _parse_state(state)
        return {group.group_id: tuple(group.row_keys) for group in parsed.groups}

    @classmethod
    def from_state_dict(
        cls,
        state: Mapping[str, Any],
        *,
        data_plane: DataPlane,
        group_size: int | None = None,
        check_rows: bool = True,
    ) -> ReplayIndex:
        """Rebuild an index from :meth:`state_dict` output after the data plane was restored.

        Checks the schema, the digest, each group's shape, and (unless ``check_rows`` is
        False: an index that only tracks ownership, such as a journal replay's) that the
        canonical partition holds exactly the indexed row keys. ``group_size``, when
        given, must match the saved one. Raises :class:`InvalidStateError`; nothing is
        modified.
        """
        parsed = _parse_state(state, group_size)
        try:
            index = cls(
                data_plane=data_plane, group_size=parsed.group_size, partition=parsed.partition
            )
        except ValueError as exc:
            raise InvalidStateError(str(exc), path="$.group_size") from None
        for position, saved in enumerate(parsed.groups):
            try:
                index._load_group(saved)
            except InvalidTransitionError as exc:
                raise InvalidStateError(str(exc), path=f"$.groups[{position}]") from None
        if not check_rows:
            return index
        present = set(data_plane.keys(parsed.partition))
        missing = sorted(set(index._owner) - present)
        extra = sorted(present - set(index._owner))
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing rows {format_keys(missing)}")
            if extra:
                parts.append(f"unindexed rows {format_keys(extra)}")
            raise InvalidStateError(
                f"replay index does not match data-plane partition {parsed.partition!r}: "
                + "; ".join(parts),
                path="$.groups",
            )
        return index

    # ---- helpers ---------------------------------------------------------------------

    def _load_group(self, saved: _GroupState) -> None:
        gid = saved.group_id
        if not gid:
            raise InvalidTransitionError("group_id must be a non-empty str")
        if gid in self._groups:
            raise InvalidTransitionError(f"duplicate group_id={gid!r}", group_id=gid)
        # Reuse commit's checks so a loaded group obeys exactly what a live one does.
        self._reserved.add(gid)
        self.commit(
            _ALWAYS_LIVE,
            gid,
            saved.row_keys,
            target_step=saved.target_step,
            min_weight_version=saved.min_weight_version,
            max_weight_version=saved.max_weight_version,
            metrics=saved.metrics,
        )

    @staticmethod
    def _check_metrics(group_id: str, metrics: Mapping[str, float] | None) -> dict[str, float]:
        if metrics is None:
            return {}
        try:
            return msgspec.convert(dict(metrics), dict[str, float])
        except (msgspec.ValidationError, TypeError, ValueError) as exc:
            raise InvalidTransitionError(
                f"group {group_id!r}: metrics must map str to float: {exc}", group_id=group_id
            ) from None

    def _existing(self, group_ids: Sequence[str], operation: str) -> list[str]:
        refuse_bare_string(group_ids, what="group_ids", operation=operation)
        ids = list(group_ids)
        duplicates = sorted(gid for gid, count in Counter(ids).items() if count > 1)
        if duplicates:
            raise InvalidTransitionError(
                f"{operation}: duplicate group ids {format_keys(duplicates)}",
                group_id=duplicates[0],
            )
        unknown = [gid for gid in ids if gid not in self._groups]
        if unknown:
            raise UnknownGroupError(
                f"{operation}: replay index has no committed groups {format_keys(unknown)}",
                group_id=unknown[0],
            )
        return ids

    def _claimed(self, group_ids: Sequence[str], operation: str) -> list[str]:
        ids = self._existing(group_ids, operation)
        unclaimed = [gid for gid in ids if self._groups[gid].claimed_step is None]
        if unclaimed:
            raise InvalidTransitionError(
                f"{operation}: groups are not claimed by a train step: {format_keys(unclaimed)}",
                group_id=unclaimed[0],
            )
        return ids

    def _remove(self, cut: MutationCut, ids: list[str]) -> None:
        keys = [key for gid in ids for key in self._groups[gid].row_keys]
        self._data_plane.clear(self._partition, keys, cut=cut)
        for gid in ids:
            for key in self._groups.pop(gid).row_keys:
                del self._owner[key]
            self._encoded.pop(gid, None)


def _parse_state(state: Mapping[str, Any], group_size: int | None = None) -> _IndexState:
    """A saved state, strictly typed, of this schema (and group size), with its digest."""
    try:
        parsed = msgspec.convert(state, _IndexState, strict=True)
    except msgspec.ValidationError as exc:
        message, path = split_validation_path(str(exc))
        raise InvalidStateError(f"invalid replay index state: {message}", path=path) from None
    if parsed.schema_version != _SCHEMA_VERSION:
        raise InvalidStateError(
            f"replay index schema_version {parsed.schema_version} is not supported "
            f"(expected {_SCHEMA_VERSION})",
            path="$.schema_version",
        )
    if group_size is not None and parsed.group_size != group_size:
        raise InvalidStateError(
            f"replay index was saved with group_size={parsed.group_size}, expected {group_size}",
            path="$.group_size",
        )
    expected_digest = _digest(parsed.partition, parsed.group_size, parsed.groups)
    if parsed.digest != expected_digest:
        raise InvalidStateError(
            f"replay index digest mismatch: saved {parsed.digest!r}, contents hash to "
            f"{expected_digest!r}",
            path="$.digest",
        )
    return parsed


class _LiveCut:
    """Loading builds a fresh, private index; no barrier section exists or is needed."""

    def require_live(self) -> None:
        return None


_ALWAYS_LIVE = _LiveCut()
