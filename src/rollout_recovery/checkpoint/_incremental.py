"""Checkpoint sidecars of one ledger, encoded again and again at the cost of what changed.

The snapshot builder encodes its ledger at every checkpoint. A full encode is O(ledger):
every group checked and MessagePack-encoded again though few changed since the last one.
:class:`IncrementalSidecar` keeps each group's encoded bytes (the native payload's groups
array is the concatenation of its items' encodings, so a group's bytes do not depend on its
neighbours) and re-encodes only the groups its owner says changed; the file's bytes are
always exactly :meth:`SidecarFormat.encode_checkpoint`'s for the same ledger and fields.

Who says what changed: the owner, which alone knows how its ledger moves (the builder reads
it off the journal records it replays). :meth:`changed` names groups touched in any way,
:meth:`reserved` the groups a record appended to the ledger, in the ledger's order, and
:meth:`changed_all` anything it cannot name (a restart's ``prepare_for_restart``). A group
left out of those is taken as unchanged: that is the one way to get wrong bytes, which is
why the property tests compare every incremental encode with a full one.

:meth:`encode_parts` hands out the file as its parts (``NativeFileParts``): the groups'
cached bytes are not joined and the payload's SHA-256 is not computed until the file is
written, by its writer (``CheckpointStore.save``, in the checkpoint's background write),
which has to pass over every byte anyway, and :meth:`staging_keys` hands out the groups'
staging keys as their per-group lists (``StagingKeys``), not as one set. Both are views of
persistent maps (``_versioned.VersionedMap``: taken in O(1), never changed by a later
encode), so nothing per encode is O(ledger): its cost follows the groups that changed
(a map sheds its garbage a few keys per change, never all at once). The checks a full
encode runs on the controller's fields are O(replay index), not O(ledger).
:meth:`encode` joins the parts: the bytes, for callers that want them.

The cache costs memory: every group's encoded bytes, about the size of one native sidecar.

The ``pt`` format cannot be built this way: its pickle memoises strings across the whole
file (a group's bytes depend on every string before it), batches list items by position,
and its zip records a CRC and a hash of the whole pickle. It is encoded in full each time.

Refusals are a full encode's: an incremental encode that finds anything wrong (a changed
group the ledger refuses to checkpoint, two groups of one admission batch that disagree, a
group it cannot place) runs the full encode, which raises what it always raised, in its order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Unpack

from ..errors import InvalidStateError
from ..ledger import RolloutRecoveryLedger
from ..ledger.codec_support import GroupState, SidecarFields, checkpoint_parts
from ._native import NativeFileParts, encode_native_fragments, encode_native_group
from ._sidecar_io import SidecarFormat
from ._versioned import MapView, VersionedMap

__all__ = ["IncrementalSidecar", "StagingKeys"]

_OPERATION = "encode_native_checkpoint"
# A ledger without groups: ``checkpoint_parts`` of it checks the controller's fields alone,
# with every check and filter a full encode runs on them.
_NO_GROUPS = RolloutRecoveryLedger()

_Admission = tuple[str, object, int | None]  # admission id, phase, target step


class StagingKeys:
    """The staging keys of a sidecar's groups as of one encode, kept as a view of the
    groups' own lists (taken in O(1), not one entry per key); iterate, or ``frozenset(...)``.

    Later encodes do not change it: the view is persistent, and the encoder replaces a
    group's list, never changes one. A key two groups share appears twice when iterated.
    """

    __slots__ = ("_lists",)

    def __init__(self, lists: MapView[list[str]]) -> None:
        self._lists = lists

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(self._lists)

    def __eq__(self, other: object) -> bool:
        """The same set of keys (tests compare snapshots with sets)."""
        if isinstance(other, StagingKeys | frozenset | set):
            return frozenset(self) == frozenset(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to sets that hash otherwise

    def __repr__(self) -> str:
        return f"StagingKeys(groups={len(self._lists)})"


class _StaleCache(Exception):
    """The cache cannot be brought up to date from what it was told: encode in full."""


class IncrementalSidecar:
    """Sidecars of ``ledger`` in either format; the native one re-encodes only changed
    groups. Not thread-safe: one owner calls it (the builder, from one thread at a time)."""

    def __init__(self, ledger: RolloutRecoveryLedger) -> None:
        self._ledger = ledger
        # Everything is stale until the first (full) encode.
        self._all_changed = True
        #: Encodes that re-encoded every group (the first, after ``changed_all``, after a
        #: refusal, in the ``pt`` format): what the tests and the benchmark watch.
        self.full_encodes = 0
        self._changed: dict[str, None] = {}  # insertion-ordered set
        self._reserved: dict[str, None] = {}  # in the ledger's order
        # The native groups array, in the ledger's order, canonical groups left out.
        self._fragments: VersionedMap[str, bytes] = VersionedMap()
        self._admissions: dict[str, _Admission] = {}
        self._batches: dict[str, set[str]] = {}
        # Staging keys of every ledger group (canonical ones too), counted: a set of keys is
        # the union over groups.
        self._staging: VersionedMap[str, list[str]] = VersionedMap()
        self._staging_counts: dict[str, int] = {}

    # -- what changed -------------------------------------------------------------------

    def changed(self, group_ids: Iterable[str]) -> None:
        """``group_ids`` may have changed in any way (added, removed, mutated)."""
        if not self._all_changed:
            self._changed.update(dict.fromkeys(group_ids))

    def reserved(self, group_id: str) -> None:
        """``group_id`` was appended to the ledger (after every group the ledger holds)."""
        if not self._all_changed:
            self._reserved.pop(group_id, None)
            self._reserved[group_id] = None

    def changed_all(self) -> None:
        """Anything may have changed: the next encode is a full one."""
        self._all_changed = True
        self._changed, self._reserved = {}, {}

    # -- encoding -----------------------------------------------------------------------

    def encode(self, format: SidecarFormat, **fields: Unpack[SidecarFields]) -> bytes:
        """The bytes of ``format.encode_checkpoint(ledger, **fields)``; refuses likewise."""
        return bytes(self.encode_parts(format, **fields))

    def encode_parts(
        self, format: SidecarFormat, **fields: Unpack[SidecarFields]
    ) -> bytes | NativeFileParts:
        """:meth:`encode`'s file, the native one as its parts (not joined, not yet
        checksummed: its writer does both as it writes); refuses like :meth:`encode`."""
        if format is not SidecarFormat.NATIVE:
            data = format.encode_checkpoint(self._ledger, **fields)
            self.full_encodes += 1
            self._update_staging_only()
            return data
        if not self._all_changed:
            try:
                return self._encode_changed(fields)
            except Exception:
                # A refusal, or a cache it cannot update: the full encode below gives the
                # bytes, or raises what a full encode raises, in its order.
                self.changed_all()
        return self._encode_all(fields)

    def expected_staging_keys(self) -> frozenset[str]:
        """``ledger.expected_staging_keys()`` as of the last encode."""
        return frozenset(self._staging_counts)

    def staging_keys(self) -> StagingKeys:
        """:meth:`expected_staging_keys` as of the last encode, without building the set:
        a persistent view, O(1)."""
        return StagingKeys(self._staging.view())

    def _encode_all(self, fields: SidecarFields) -> NativeFileParts:
        ledger = self._ledger
        self.full_encodes += 1
        groups, controller = checkpoint_parts(ledger, operation=_OPERATION, **fields)
        self._fragments = VersionedMap((g.group_id, encode_native_group(g)) for g in groups)
        self._admissions = {}
        self._batches = {}
        for group in groups:
            self._admit(group)
        # Staging keys of every ledger group: the sidecar's, and the canonical ones' (a
        # group the ledger still holds after its publish).
        canonical = fields.get("canonical_group_ids") or ()
        held = [ledger.writable_group(gid) for gid in canonical if gid in ledger]
        self._fill_staging([*groups, *held])
        self._changed, self._reserved = {}, {}
        self._all_changed = False
        return encode_native_fragments(self._fragments.view(), controller)

    def _encode_changed(self, fields: SidecarFields) -> NativeFileParts:
        # The controller's fields with every check a full encode runs on them.
        _, controller = checkpoint_parts(_NO_GROUPS, operation=_OPERATION, **fields)
        canonical = fields.get("canonical_group_ids") or ()
        ledger, fragments = self._ledger, self._fragments
        reserved = self._reserved
        touched_batches: set[str] = set()
        # A failure from here on leaves the cache half updated: ``encode`` then rebuilds it.
        for group_id in dict.fromkeys([*self._changed, *reserved]):
            touched_batches.update(self._forget_admission(group_id))
            group = ledger.writable_group(group_id) if group_id in ledger else None
            self._set_staging(group_id, [] if group is None else group.sealed_staging_keys())
            if group_id in reserved:
                fragments.pop(group_id, None)  # appended below, at the ledger's end
            if group is None or group_id in canonical:
                fragments.pop(group_id, None)
                continue
            if group_id in fragments:
                fragments[group_id] = encode_native_group(group)  # in place: same position
            elif group_id not in reserved:
                # In the ledger all along, leaving the replay index: its place is unknown.
                raise _StaleCache(group_id)
            touched_batches.add(self._admit(group))
        for group_id in reserved:
            if group_id in ledger and group_id not in canonical:
                fragments[group_id] = encode_native_group(ledger.writable_group(group_id))
        self._check_batches(touched_batches)
        data = encode_native_fragments(fragments.view(), controller)
        self._changed, self._reserved = {}, {}
        self._all_changed = False
        return data

    # -- the cross-group rule and the staging keys, kept per group ------------------------

    def _admit(self, group: GroupState) -> str:
        admission = group.admission_id
        self._admissions[group.group_id] = (admission, group.phase, group.target_step)
        self._batches.setdefault(admission, set()).add(group.group_id)
        return admission

    def _forget_admission(self, group_id: str) -> list[str]:
        known = self._admissions.pop(group_id, None)
        if known is None:
            return []
        members = self._batches[known[0]]
        members.discard(group_id)
        if not members:
            del self._batches[known[0]]
        return [known[0]]

    def _check_batches(self, admissions: Iterable[str]) -> None:
        """``check_admission_batches`` for the batches of changed groups: the rest agreed at
        the last encode and did not change."""
        for admission in admissions:
            members = self._batches.get(admission, ())
            if len({self._admissions[member][1:] for member in members}) > 1:
                raise InvalidStateError(f"admission batch {admission!r} disagrees")

    def _set_staging(self, group_id: str, keys: list[str]) -> None:
        counts, staging = self._staging_counts, self._staging
        before = staging.get(group_id)
        for key in before or ():
            left = counts[key] - 1
            if left:
                counts[key] = left
            else:
                del counts[key]
        if keys:
            staging[group_id] = keys  # in place: the order of staging keys is no one's
            for key in keys:
                counts[key] = counts.get(key, 0) + 1
        elif before is not None:
            staging.pop(group_id)

    def _update_staging_only(self) -> None:
        """After a full encode in another format: the staging keys are current, the
        native cache is not."""
        self._fill_staging(self._ledger.writable_groups())
        self.changed_all()

    def _fill_staging(self, groups: Iterable[GroupState]) -> None:
        staging = {group.group_id: group.sealed_staging_keys() for group in groups}
        self._staging = VersionedMap((group_id, keys) for group_id, keys in staging.items() if keys)
        self._staging_counts = dict(Counter(chain.from_iterable(staging.values())))

    def __repr__(self) -> str:
        return f"IncrementalSidecar(groups={len(self._fragments)}, stale={self._all_changed})"
