"""Choosing what a sibling's next attempt continues: lineage, verification, per-call reuse."""

from __future__ import annotations

from capture_support import stage_chain
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery.capture import CaptureWriter
from rollout_recovery.control._checkpointing import _interrupted_tokens
from rollout_recovery.control._resume import (
    attempt_rollout_ids,
    choose_prefixes,
    resumed_record,
    version_filter,
)
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.history.records import ReusePolicy
from rollout_recovery.ledger import (
    PromptGroupRecoveryRecord,
    RecoveryGranularity,
    RolloutRecoveryLedger,
)
from rollout_recovery.rollout._faults import _tamper as tamper


class Cut:
    def require_live(self) -> None:
        return None


CUT = Cut()


def retried_group(
    *, rounds: int = 2, granularity: RecoveryGranularity = RecoveryGranularity.SIBLING
) -> tuple[RolloutRecoveryLedger, PromptGroupRecoveryRecord]:
    """A group of two siblings whose attempts were lost ``rounds - 1`` times, now on its
    ``rounds``-th dispatch."""
    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        CUT,
        prompt_id="7",
        prompt_payload={"idx": 7},
        expected_generations=2,
        target_step=0,
        start_weight_version=0,
        group_id="g7",
        recovery_granularity=granularity,
    )
    ledger.mark_group_dispatched(CUT, "g7")
    for _ in range(rounds - 1):
        ledger.abandon_unsealed(CUT, "g7")
        ledger.prepare_incomplete_retry(CUT, "g7")
        ledger.mark_group_dispatched(CUT, "g7")
    return ledger, ledger.get_group("g7")


def stage(store: MemoryDataPlane, rollout_id: str, versions: list[int]) -> None:
    stage_chain(store, rollout_id, versions, generated=2)


def keep_all(version: int) -> bool:
    return True


def test_the_longest_verified_prefix_of_a_lost_attempt_is_chosen() -> None:
    _, group = retried_group(rounds=3)
    first, second, current = attempt_rollout_ids(group, 0)
    store = MemoryDataPlane()
    stage(store, first, [0, 0, 0])
    stage(store, second, [0, 0])  # lost while it copied the first's calls
    stage(store, current, [0])  # the fresh attempt itself is never a candidate
    choices = choose_prefixes(group, [0, 1], store, keeps=keep_all, include_current=False)
    assert set(choices) == {0}  # sibling 1 staged nothing
    prefix = choices[0].prefix
    assert prefix is not None and prefix.rollout_id == first and len(prefix.calls) == 3
    record = resumed_record("g7", 0, current, choices[0])
    assert record.from_rollout_id == first and record.calls == prefix.staging_keys
    assert record.tokens == 6 and record.weight_versions == [0, 0, 0]


def test_a_tampered_attempt_is_refused_and_says_why() -> None:
    _, group = retried_group()
    lost, current = attempt_rollout_ids(group, 1)
    store = MemoryDataPlane()
    stage(store, lost, [0, 0])
    tamper(store, CaptureWriter.staging_partition, f"{lost}/c1")  # the simulated tamper fault
    choices = choose_prefixes(group, [1], store, keeps=keep_all, include_current=False)
    assert choices[1].prefix is None
    assert len(choices[1].refused) == 1 and "digest_mismatch" in choices[1].refused[0]
    record = resumed_record("g7", 1, current, choices[1])
    assert record.from_rollout_id is None and record.refused == choices[1].refused


def test_rows_of_another_attempt_are_never_a_siblings_prefix() -> None:
    """Lineage: only attempts the ledger lists for this sibling are read."""
    _, group = retried_group()
    store = MemoryDataPlane()
    stage(store, "g7_g0_a" + "f" * 32, [0, 0])  # not an attempt of the ledger's
    other_sibling = attempt_rollout_ids(group, 1)[0]
    stage(store, other_sibling, [0])
    choices = choose_prefixes(group, [0], store, keeps=keep_all, include_current=False)
    assert choices == {}


def test_prompt_group_cohorts_are_not_resumed() -> None:
    _, group = retried_group(granularity=RecoveryGranularity.PROMPT_GROUP)
    store = MemoryDataPlane()
    stage(store, attempt_rollout_ids(group, 0)[0], [0, 0])
    assert choose_prefixes(group, [0, 1], store, keeps=keep_all, include_current=False) == {}


def test_at_a_restore_the_interrupted_attempt_itself_is_the_candidate() -> None:
    ledger, group = retried_group(rounds=1)
    ledger.prepare_for_restart(CUT)
    group = ledger.get_group("g7")
    (interrupted,) = attempt_rollout_ids(group, 0)
    store = MemoryDataPlane()
    stage(store, interrupted, [0, 0])
    at_restore = choose_prefixes(group, [0], store, keeps=keep_all, include_current=True)
    assert at_restore[0].prefix is not None and len(at_restore[0].prefix.calls) == 2
    assert choose_prefixes(group, [0], store, keeps=keep_all, include_current=False) == {}


@settings(max_examples=60, deadline=None)
@given(
    versions=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    lineage=st.sets(st.integers(0, 6)),
    reuse=st.sampled_from(list(ReusePolicy)),
    restore=st.booleans(),
)
def test_calls_follow_the_reuse_policy_one_by_one(
    versions: list[int], lineage: set[int], reuse: ReusePolicy, restore: bool
) -> None:
    """A restore keeps a call as it keeps a seal: all every call, ancestors those of the
    restored lineage, none nothing after the snapshot; within a run no weights are lost.
    A prefix stops at its first call the policy does not keep (a prefix is contiguous)."""
    _, group = retried_group()
    lost = attempt_rollout_ids(group, 0)[0]
    store = MemoryDataPlane()
    stage(store, lost, versions)
    keeps = version_filter(reuse, lineage=lineage, restore=restore)
    choice = choose_prefixes(group, [0], store, keeps=keeps, include_current=False)[0]

    def kept(version: int) -> bool:
        if not restore or reuse is ReusePolicy.ALL:
            return True
        return reuse is ReusePolicy.ANCESTORS and version in lineage

    expected = 0
    while expected < len(versions) and kept(versions[expected]):
        expected += 1
    got = 0 if choice.prefix is None else len(choice.prefix.calls)
    assert got == expected
    assert bool(choice.refused) == (expected < len(versions))
    if choice.prefix is not None:
        assert choice.prefix.weight_versions == versions[:expected]


def test_a_kill_costs_the_interrupted_calls_no_kept_row_continues() -> None:
    """The restore's count of tokens a kill costs: an interrupted attempt that was still
    copying an earlier attempt's calls costs nothing for the copies (the same calls are
    kept), and what it generated itself is lost unless kept."""
    ledger, group = retried_group()
    older, interrupted = attempt_rollout_ids(group, 0)
    store = MemoryDataPlane()
    stage(store, older, [0, 0])
    stage_chain(store, interrupted, [0], generated=2)  # the first call, copied
    keep = {f"{older}/c0", f"{older}/c1"}
    lost = {group.group_id: [(0, interrupted)]}
    assert _interrupted_tokens(ledger, store, lost, keep) == (0, 0)
    assert _interrupted_tokens(ledger, store, lost, {f"{older}/c0"}) == (0, 0)
    # Kept nothing (resume = "attempt", reuse = "none"): its staged tokens are lost.
    assert _interrupted_tokens(ledger, store, lost, set()) == (2, 0)
