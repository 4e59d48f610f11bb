"""The typed history: every record a run appends, one tagged union.

Each line of ``events.jsonl`` is one of these Structs as a JSON object whose ``"event"``
field names its type (``{"event": "sibling_sealed", ...}``); :func:`decode_record` turns a
line back into its Struct or refuses it with the reason, so nobody reads a record by
string key. A record carries every id and version it names, so the history alone tells
what happened to each prompt, sibling and attempt, and what each training step used.

This module is public (``from rollout_recovery.history import records``): the records
are the on-disk schema a user reads and a test builds. The schema is documented in
``docs/journal.md`` ("Records"); a change to a record once its version was released is
a new :data:`HISTORY_VERSION`. Reasons are enums, not free text.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec

from .._row_facts import RowFacts
from ..ledger import RecoveryGranularity
from ..rewards import RewardChecks
from ..rollout import FailureReason

__all__ = [
    "HISTORY_VERSION",
    "READABLE_HISTORY_VERSIONS",
    "RECORD_TYPES",
    "AbandonedAttempt",
    "AttemptResumed",
    "AttemptsAbandoned",
    "BackendEvent",
    "BatchAdmitted",
    "CheckpointCommitted",
    "DiscardedSeal",
    "DropReason",
    "FreshAttempt",
    "GroupPublished",
    "GroupSealed",
    "HistoryRecord",
    "PromptAliased",
    "PromptDropped",
    "PromptTaken",
    "Restored",
    "ReusePolicy",
    "RoundStarted",
    "RunStarted",
    "Seal",
    "SiblingSealed",
    "StepTrained",
    "TrainedRow",
    "decode_record",
    "encode_record",
]

#: The version of the record schema, written in every ``run_started``. Version 2 added the
#: ``attempt_resumed`` record and fields with defaults (``Seal``'s inherited calls,
#: ``TrainedRow.weight_version_spans``, ``Restored``'s resume counts), and a round a
#: restart interrupted no longer takes a round number. The schema of this version is
#: pinned in ``tests/history/test_history_schema.py``.
HISTORY_VERSION = 2

#: The versions a reader of this schema accepts: every version-1 line decodes as a version-2
#: record (version 2 only added), so a version-1 history is read and audited as it is.
READABLE_HISTORY_VERSIONS: frozenset[int] = frozenset({1, 2})


class DropReason(StrEnum):
    """Why a prompt was given up (its step then closes short)."""

    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"


class _Record(
    msgspec.Struct, tag_field="event", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Base of every record: tagged by ``"event"``, immutable, unknown fields refused."""


class RunStarted(_Record, tag="run_started", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A job started or resumed in this directory (one per process)."""

    version: int = HISTORY_VERSION
    pid: int
    #: The checkpoint restored, or None for a fresh start.
    resumed_from: str | None
    #: The step the job starts training at.
    step: int
    #: ``job.steps``: the run is complete once this many steps are trained.
    steps: int
    prompts_per_step: int
    group_size: int
    #: Operational settings changed by this resume (``"$.http.servers: ... != ..."``).
    config_changes: list[str] = []


class PromptTaken(
    _Record, tag="prompt_taken", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """The dataloader yielded a prompt and the ledger reserved its group."""

    group_id: str
    prompt_idx: int
    #: The dataloader's position: contiguous from 0 over the whole run.
    position: int
    batch: int
    task_name: str | None = None
    task_source: str | None = None
    granularity: RecoveryGranularity = RecoveryGranularity.SIBLING
    weight_version: int = 0
    #: The rollout ids of the group's first attempts, one per sibling.
    attempts: list[str] = []
    #: A prompt taken by the recorder (a foreign loop's): the caller's dataset identity,
    #: the sha256 of the prompt's canonical JSON, and the caller's own ids for it. None
    #: for a prompt the job's dataloader yielded.
    key: str | None = None
    prompt_digest: str | None = None
    aliases: list[str] = []


class PromptAliased(
    _Record, tag="prompt_aliased", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """The recorder's caller took a prompt again under new ids of its own (verl draws a
    fresh ``uid`` per fetch): they are recorded as aliases of the group's key."""

    group_id: str
    key: str
    aliases: list[str]


class BatchAdmitted(
    _Record, tag="batch_admitted", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A reserved batch entered the staleness window: it trains at ``target_step``."""

    batch: int
    group_ids: list[str]
    target_step: int
    weight_version: int


class FreshAttempt(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    generation_index: int
    rollout_id: str


class RoundStarted(
    _Record, tag="round_started", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A generation round of a group: the attempts it dispatched."""

    group_id: str
    #: 1 for the first round; the group's retry budget counts these (a round a restart
    #: interrupted is not counted, so the next one has the same number).
    round: int
    dispatched: list[FreshAttempt]
    weight_version: int


class AttemptResumed(
    _Record, tag="attempt_resumed", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A fresh attempt is handed the staged calls of an earlier, lost attempt of its sibling
    to continue (``[recovery] resume = "call"``), or told why none of them verified.

    Written after the ``round_started`` that dispatched ``rollout_id`` and before the
    attempt runs; its seal says how many of those calls it used (``Seal.inherited_calls``).
    """

    group_id: str
    generation_index: int
    #: The fresh attempt.
    rollout_id: str
    #: The attempt whose staged calls it continues; None when none verified.
    from_rollout_id: str | None = None
    #: The staging keys of those calls, root first.
    calls: list[str] = []
    #: Generated tokens they hold, and the weight version of each.
    tokens: int = 0
    weight_versions: list[int] = []
    #: Earlier attempts whose staged calls are not (all) continued, and why
    #: (``"<rollout id>: <reason>"``): a tampered, missing or foreign row, a broken chain,
    #: calls under weights ``[recovery] reuse`` does not keep.
    refused: list[str] = []


class Seal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One finished attempt as the ledger sealed it."""

    generation_index: int
    rollout_id: str
    #: The token-free receipt (the capture contract's plain dict).
    receipt: dict[str, Any]
    reward: float
    mask_sample: bool
    #: The seal-time text checks, the type the ledger stores and the reward code reads.
    reward_checks: RewardChecks | None = None
    #: Generated tokens of its calls (those it inherited included).
    tokens: int
    #: The weight version of each of its model calls, in call order.
    weight_versions: list[int] = []
    #: Its first calls (and their generated tokens) continued an earlier attempt of the
    #: sibling (``attempt_resumed``) instead of being generated again.
    inherited_calls: int = 0
    inherited_tokens: int = 0
    #: Why the backend did not use a prefix it was handed (it started over).
    resume_refused: str | None = None


class SiblingSealed(
    _Record, tag="sibling_sealed", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A sibling's attempt sealed (sibling granularity)."""

    group_id: str
    seal: Seal


class GroupSealed(
    _Record, tag="group_sealed", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A prompt-group cohort sealed all at once."""

    group_id: str
    seals: list[Seal]


class AbandonedAttempt(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    generation_index: int
    rollout_id: str
    reason: FailureReason


class AttemptsAbandoned(
    _Record, tag="attempts_abandoned", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Unsealed attempts of a group were abandoned (their siblings go to another round).

    ``whole_group``: a prompt-group cohort, sealed siblings included.
    """

    group_id: str
    attempts: list[AbandonedAttempt]
    whole_group: bool = False


class PromptDropped(
    _Record, tag="prompt_dropped", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A prompt was given up; ``target_step`` trains without it."""

    group_id: str
    prompt_idx: int
    target_step: int
    reason: DropReason
    detail: str = ""


class GroupPublished(
    _Record, tag="group_published", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A sealed group became N canonical rows in the replay index."""

    group_id: str
    target_step: int
    row_keys: list[str]
    valid_rows: int
    min_weight_version: int
    max_weight_version: int
    #: The finalizer's metrics of the group (logging; the replay index keeps them).
    metrics: dict[str, float] = {}


class TrainedRow(RowFacts, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One canonical row as a training step used it: the facts its stored metadata holds
    too (``RowFacts``: ids, ``valid``, ``reward``, ``weight_version``,
    ``weight_version_spans``) and its prompt's dataset index.

    Not the stored metadata itself (``finalize.CanonicalRowMeta``, the same ``RowFacts``
    and more): the journal records only what the audit checks, and the row's ``prompt_id``
    (the ledger's string) is here the dataloader's index the journal names prompts by.
    """

    prompt_idx: int


class StepTrained(
    _Record, tag="step_trained", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A training step: the groups it consumed, every row, the weights it produced."""

    step: int
    #: The weight version this step produced.
    weight_version: int
    group_ids: list[str]
    rows: list[TrainedRow]
    valid_rows: int
    mean_reward: float | None = None


class CheckpointCommitted(
    _Record, tag="checkpoint_committed", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A checkpoint committed: ``name`` holds the snapshot of the history up to ``position``
    (a byte offset of ``events.jsonl``) and the trainer at ``step``."""

    step: int
    name: str
    position: int
    #: The exclusive barrier hold, and what mutations waited in all (microseconds).
    hold_us: int = 0
    stall_us: int = 0
    #: The recorder's caller's own trainer checkpoint this snapshot goes with (the tag it
    #: passed to ``mark_checkpoint``, and to ``open(resume_checkpoint=)`` to resume it).
    trainer_checkpoint: str | None = None


class ReusePolicy(StrEnum):
    """What a restore does with siblings sealed under weights it lost (``[recovery] reuse``)."""

    #: Keep every seal (off-policy, corrected by the captured logprobs).
    ALL = "all"
    #: Keep seals whose calls used only versions the restored policy descends from.
    ANCESTORS = "ancestors"
    #: Regenerate everything sealed after the snapshot (what NeMo-RL does).
    NONE = "none"


class DiscardedSeal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A journaled seal a restore did not keep (its reuse policy said so)."""

    group_id: str
    generation_index: int
    rollout_id: str
    tokens: int
    weight_versions: list[int] = []


class Restored(_Record, tag="restored", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A job resumed: the snapshot it loaded, the journal it replayed, what it kept.

    Training after the snapshot is rolled back (the policy lives only in checkpoints):
    ``rolled_back_steps`` are trained again, from the same canonical rows. Seals the
    reuse policy discarded are listed; every other journaled seal is kept.
    """

    checkpoint: str
    #: The step training resumes at (the snapshot's).
    step: int
    #: Where the snapshot's history ends in ``events.jsonl`` (a byte offset).
    snapshot_position: int
    replayed_records: int
    torn_tail_bytes: int = 0
    reuse: ReusePolicy = ReusePolicy.ALL
    rolled_back_steps: list[int] = []
    discarded: list[DiscardedSeal] = []
    groups_in_ledger: int
    sealed_siblings_kept: int
    canonical_groups: int
    shortfall: dict[int, int] = {}
    #: Seals the reuse policy discarded, and their tokens.
    seals_lost: int = 0
    tokens_lost: int = 0
    #: Tokens of sealed siblings kept (what a discard-all restart would regenerate).
    tokens_reused: int = 0
    #: Tokens of finished groups waiting to train, kept.
    canonical_tokens_kept: int = 0
    #: Generated tokens of calls staged by attempts the crash interrupted that are
    #: generated again: their rows are deleted, except those kept for resumption.
    tokens_in_flight_lost: int = 0
    #: The part of those of prompt-group cohorts: a cohort is generated again whole (its
    #: siblings belong together), so its calls are never continued.
    cohort_tokens_in_flight_lost: int = 0
    #: Staged calls (and their generated tokens) of unsealed attempts kept for their
    #: siblings' next attempts to continue (``[recovery] resume = "call"``).
    calls_resumable: int = 0
    tokens_resumable: int = 0
    #: Lost attempts whose staged calls were not kept, and why (``"<rollout id>: <reason>"``).
    resume_refused: list[str] = []

    # What the restore's readers add up (the job's summary and metrics marker, chaos),
    # derived here once.

    @property
    def tokens_regenerated(self) -> int:
        """Generated tokens this restore threw away, to be generated again: the discarded
        seals' and those of the interrupted attempts' calls not kept for resumption."""
        return self.tokens_lost + self.tokens_in_flight_lost

    @property
    def tokens_kept(self) -> int:
        """Generated tokens this restore kept: of finished groups, of sealed siblings and
        of staged calls kept for resumption."""
        return self.canonical_tokens_kept + self.tokens_reused + self.tokens_resumable

    def rows_kept(self, group_size: int) -> int:
        """Rows this restore kept: every row of its finished groups (``group_size`` each)
        and its sealed siblings of unfinished ones."""
        return self.canonical_groups * group_size + self.sealed_siblings_kept


class BackendEvent(_Record, tag="backend", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Something a backend's parts did: a server died or rejoined, an actor was replaced,
    a call was redispatched, weights were loaded (``kind`` says which)."""

    kind: str
    detail: dict[str, Any] = {}


#: Every record type a history holds.
HistoryRecord = (
    RunStarted
    | PromptTaken
    | PromptAliased
    | BatchAdmitted
    | RoundStarted
    | AttemptResumed
    | SiblingSealed
    | GroupSealed
    | AttemptsAbandoned
    | PromptDropped
    | GroupPublished
    | StepTrained
    | CheckpointCommitted
    | Restored
    | BackendEvent
)

#: The ``event`` tags a journal may hold, in the union's order (what ``journal --type``
#: accepts).
RECORD_TYPES: tuple[str, ...] = tuple(
    str(member.__struct_config__.tag) for member in HistoryRecord.__args__
)


def _plain_number(value: object) -> object:
    # numpy scalars (a reward, a count) become their Python value.
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise NotImplementedError(f"cannot write a {type(value).__name__} to the history")


# msgspec writes NaN and infinities as null: strict JSON by construction.
_ENCODER = msgspec.json.Encoder(enc_hook=_plain_number)
_DECODER: msgspec.json.Decoder[HistoryRecord] = msgspec.json.Decoder(HistoryRecord)


def encode_record(record: HistoryRecord) -> bytes:
    """One strict-JSON object (no newline)."""
    return _ENCODER.encode(record)


def decode_record(line: bytes) -> HistoryRecord:
    """The record on one line; ``msgspec.ValidationError`` / ``DecodeError`` if it is not
    one (the reader adds the file and line number)."""
    return _DECODER.decode(line)
