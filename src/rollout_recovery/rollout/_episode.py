"""The agent episode, written once: a task's turns against a one-method model client.

Every backend runs the same loop (:func:`run_episode`); only where the tokens come from
differs (:class:`ModelClient`: the numpy policy in process, HTTP servers, a transformers
model), and what an episode asks for is the task's (:class:`EpisodeTask`: the digit task,
"emit token X"). One attempt:

1. the task builds the episode from the prompt (a prompt that does not match its task is a
   bug and raises);
2. while the episode asks for a call (:class:`Turn`: the whole prompt as token ids, the
   sampling, a kind that names the call), the continuation is checked against its parent
   *before* it is sent, the client generates a :class:`Completion`, and the call is staged
   through the attempt's ``CaptureWriter`` before the episode sees it: the staged record is
   the acknowledgement;
3. the episode grades itself (a grade may be awaited: a reward function of one's own runs
   off the event loop) and the receipt is assembled over every staged call.

A client signals a call that produced nothing usable (a refused request, a reply that
fails its checks, a capture that did not commit) by raising :class:`CallFailed`: the
attempt then ends as a *sealed failed attempt*, its receipt poisoned with the reason, so
the sibling trains as a masked placeholder that says why; so does a grade whose reward
function failed (``RewardFunctionError``: ``data_error:reward_raised``, ...).
Infrastructure failures (a dead server, a crashed worker) raise
:class:`~rollout_recovery.errors.GenerationError` out of the client; the episode returns
them as an :class:`~rollout_recovery.rollout.AttemptFailure` (unsealed, the calls staged so
far kept for the next attempt to continue) and the controller retries the sibling.

Resume. Given a :class:`~rollout_recovery.capture.StagedPrefix` (the staged calls of an
earlier attempt of the same sibling, already verified against the store), the episode is
first replayed from the prefix's completions: each call the episode asks for must be the
prefix's call, with the same prompt. If all fit, the prefix's calls are staged again under
this attempt (same tokens, logprobs, weight versions and extras, plus ``resumed_from``: no
token is generated again) and the episode continues from the last of them; the receipt
then covers every call, inherited and new. A prefix of another sibling, or one the
episode does not ask for, is not used: the episode starts over, and the result says why
(``AttemptResult.resume_refused``).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..capture import CaptureWriter, Receipt, StagedPrefix
from ..errors import GenerationError, InvalidArgumentError, RewardFunctionError
from ..rewards import RewardChecks
from ._protocol import AttemptFailure, AttemptRequest, AttemptResult

__all__ = [
    "CallFailed",
    "Completion",
    "Episode",
    "EpisodeTask",
    "ModelClient",
    "Sampling",
    "Turn",
    "call_id_for",
    "run_episode",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """How one call samples: at most ``max_tokens`` tokens (the client owns temperature
    and records it in the call's extras)."""

    max_tokens: int

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidArgumentError("max_tokens must be an int", path="$.max_tokens")
        if self.max_tokens < 1:
            raise InvalidArgumentError("max_tokens must be >= 1", path="$.max_tokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """What one model call generated: token ids, one logprob per id, the weight version
    that generated them, and per-call material the tokens do not carry (``extras``: plain
    JSON-like values, staged and digested with the call). A call new weights interrupted
    names each token's version in ``token_versions`` (staged as its version spans;
    ``weight_version`` is then the last one)."""

    token_ids: Sequence[int]
    logprobs: Sequence[float]
    weight_version: int
    extras: Mapping[str, Any] | None = None
    token_versions: Sequence[int] | None = None


class ModelClient(Protocol):
    """One model call: ``prompt_ids`` in, a :class:`Completion` out.

    ``call_id`` names the call (unique per physical call; for logs and events). Raise
    :class:`~rollout_recovery.rollout.DataFailure` for a call whose outcome is unusable
    and would be the same elsewhere, :class:`~rollout_recovery.errors.GenerationError`
    for an infrastructure failure. A client serves one attempt: it may hold the attempt's
    worker or session.
    """

    async def generate(
        self, prompt_ids: Sequence[int], *, call_id: str, sampling: Sampling
    ) -> Completion: ...


class CallFailed(Exception):
    """A call produced nothing the episode can use: the attempt ends sealed as failed.

    ``receipt_reason`` becomes the receipt's ``failure_reason``, so the masked placeholder
    says why; ``detail`` is for logs. A client of a server raises the subclass
    :class:`~rollout_recovery.rollout.DataFailure` (``data_error:<reason>``).
    """

    def __init__(self, receipt_reason: str, detail: str = "") -> None:
        super().__init__(f"{receipt_reason}: {detail}" if detail else receipt_reason)
        self.receipt_reason = receipt_reason
        self.detail = detail


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """One call an episode asks for: its whole prompt, its sampling, and its kind (a short
    name that becomes part of the call's id: ``reason``, ``answer``, ``gen``)."""

    kind: str
    prompt_ids: Sequence[int]
    sampling: Sampling


class Episode(Protocol):
    """One attempt's environment, stepped by :func:`run_episode`.

    It must be a deterministic function of its prompt and the completions it observed
    (that is what lets an attempt continue another's staged calls).
    """

    def next_turn(self) -> Turn | None:
        """The next call, or None when the episode is over."""
        ...

    def observe(self, completion: Completion) -> None:
        """The completion of the call :meth:`next_turn` last returned."""
        ...

    def grade(
        self,
    ) -> tuple[float, RewardChecks | None] | Awaitable[tuple[float, RewardChecks | None]]:
        """The finished episode's reward and its reward checks (None: not computed), or
        an awaitable of them; a ``RewardFunctionError`` when its reward function failed."""
        ...


class EpisodeTask(Protocol):
    """A task: builds the episode of one prompt (checked against the task; a prompt that
    does not match is a bug, raised as ``InvalidArgumentError``)."""

    def episode(self, prompt: Mapping[str, Any]) -> Episode: ...


def call_id_for(rollout_id: str, index: int, kind: str) -> str:
    """The id of call ``index`` of an attempt: unique per physical call (a retry is a new
    rollout id, so its calls get new ids too), short whatever the rollout id's length."""
    digest = hashlib.sha256(f"{rollout_id}/{index}".encode()).hexdigest()[:16]
    return f"{kind}-{digest}"


def _prefix_refusal(request: AttemptRequest, prefix: StagedPrefix) -> str | None:
    """Why ``prefix`` cannot be this attempt's: another sibling's, or this attempt's own."""
    # Every attempt of a sibling is named ``{group}_g{index}_a{attempt}`` by the ledger.
    sibling = f"{request.group_id}_g{request.generation_index}_a"
    if not prefix.rollout_id.startswith(sibling) or prefix.rollout_id == request.rollout_id:
        return (
            f"foreign prefix: {prefix.rollout_id} is not an earlier attempt of sibling "
            f"{request.group_id}/{request.generation_index}"
        )
    return None


def _replay(task: EpisodeTask, request: AttemptRequest, prefix: StagedPrefix) -> Episode | str:
    """A fresh episode stepped through the prefix's calls, or why they do not fit."""
    episode = task.episode(request.prompt)
    completions = _completions(prefix)
    for index, (call, completion) in enumerate(zip(prefix.calls, completions, strict=True)):
        turn = episode.next_turn()
        if turn is None:
            return f"prefix call {index} ({call.staging_key}): the episode was already over"
        if [int(t) for t in turn.prompt_ids] != call.prompt_token_ids.tolist():
            return f"prefix call {index} ({call.staging_key}): the episode asks another prompt"
        episode.observe(completion)
    return episode


def _completions(prefix: StagedPrefix, *, resumed: bool = False) -> list[Completion]:
    """The prefix's staged calls as the completions they were; ``resumed`` marks the
    copies an inheriting attempt stages (their extras name the row each came from)."""
    completions = []
    for call in prefix.calls:
        extras = call.extras
        if resumed:
            extras = {**(extras or {}), "resumed_from": call.staging_key}
        completions.append(
            Completion(
                token_ids=call.token_ids.tolist(),
                logprobs=call.logprobs.tolist(),
                weight_version=call.weight_version,
                extras=extras,
            )
        )
    return completions


async def run_episode(
    request: AttemptRequest,
    capture: CaptureWriter,
    *,
    task: EpisodeTask,
    client: ModelClient,
    prefix: StagedPrefix | None = None,
    stage_in_thread: bool = False,
) -> AttemptResult | AttemptFailure:
    """Run one attempt of ``task`` against ``client`` (see the module docstring).

    ``prefix`` continues an earlier attempt's staged calls; ``stage_in_thread`` stages
    from a worker thread (a durable store fsyncs every put).
    """
    rollout_id = request.rollout_id
    episode = task.episode(request.prompt)
    inherited = StagedPrefix(rollout_id=rollout_id, calls=())
    refused: str | None = None
    if prefix is not None and prefix.calls:
        refused = _prefix_refusal(request, prefix)
        if refused is None:
            replayed = _replay(task, request, prefix)
            if isinstance(replayed, str):
                refused = replayed
            else:
                episode, inherited = replayed, prefix
    attempt = capture.attempt(rollout_id)
    generated = 0
    staged: list[str] = []  # the call ids staged, in order

    async def stage(turn_prompt: Sequence[int], call_id: str, completion: Completion) -> None:
        staged.append(call_id)
        await attempt.stage(
            call_id,
            prompt_token_ids=turn_prompt,
            generated_token_ids=completion.token_ids,
            generated_logprobs=completion.logprobs,
            weight_version=completion.weight_version,
            extras=completion.extras,
            token_versions=completion.token_versions,
            in_thread=stage_in_thread,
        )

    copies = _completions(inherited, resumed=True)
    for index, (call, copy) in enumerate(zip(inherited.calls, copies, strict=True)):
        # The same call, staged again under this attempt: its receipt then owns it.
        prompt = call.prompt_token_ids.tolist()
        await stage(prompt, call_id_for(rollout_id, index, "resumed"), copy)
        generated += len(copy.token_ids)
    inherited_tokens = generated
    try:
        while (turn := episode.next_turn()) is not None:
            call_id = call_id_for(rollout_id, attempt.calls, turn.kind)
            # Before anything is sent: a continuation must extend its parent exactly.
            attempt.check_next(call_id, turn.prompt_ids)
            completion = await client.generate(
                turn.prompt_ids, call_id=call_id, sampling=turn.sampling
            )
            await stage(turn.prompt_ids, call_id, completion)
            generated += len(completion.token_ids)
            episode.observe(completion)
    except CallFailed as failed:
        receipt = attempt.failed_receipt(call_id, failed.receipt_reason)
        return _failed_attempt(rollout_id, receipt, len(inherited.calls), refused)
    except GenerationError as error:
        return AttemptFailure.from_error(request, error)
    try:
        graded = episode.grade()
        reward, checks = await graded if inspect.isawaitable(graded) else graded
    except RewardFunctionError as error:
        # The calls are staged and fine; what they earned is unknown, so the attempt is
        # sealed failed at its last call.
        last = staged[-1] if staged else call_id_for(rollout_id, 0, "grade")
        receipt = attempt.failed_receipt(last, f"data_error:{error.reason}")
        return _failed_attempt(rollout_id, receipt, len(inherited.calls), refused)
    receipt = attempt.receipt(reward=reward)
    return AttemptResult(
        rollout_id=rollout_id,
        receipt=receipt,
        reward=reward,
        mask_sample=False,
        reward_checks=checks,
        generated_tokens=generated,
        inherited_calls=len(inherited.calls),
        inherited_tokens=inherited_tokens,
        resume_refused=refused,
    )


def _failed_attempt(
    rollout_id: str, receipt: Receipt, inherited: int, refused: str | None
) -> AttemptResult:
    """A sealed failed attempt: its receipt (every staged call listed, so their rows are
    cleared with it, poisoned with the failed call's reason) and no reward."""
    return AttemptResult(
        rollout_id=rollout_id,
        receipt=receipt,
        reward=0.0,
        mask_sample=True,
        reward_checks=None,
        generated_tokens=0,
        inherited_calls=inherited,
        resume_refused=refused,
    )
