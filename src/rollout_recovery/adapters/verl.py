"""verl's agent loop with zero-loss rollouts: ``RecoveringAgentLoop``.

verl (0.9.x) builds a new agent-loop instance per sibling and calls its ``run``; its V1
trainer re-runs a whole prompt group after a restart, siblings that had finished included.
``RecoveringAgentLoop`` wraps any registered agent loop (``inner``) and records every sibling
in a recorder run directory (``rollout_recovery.recorder``):

- a sibling sealed before the kill is answered from the journal: the stored output, with
  its original ``extra_fields`` (``min_global_steps``/``max_global_steps``, the weight
  versions verl's off-policy filter reads), and no generate call;
- an unsealed sibling runs the inner loop again behind a ``RecordingServerManager``, which
  stages every generate call it answers; a call whose prompt tokens were staged before the
  kill is answered from the journal, so a multi-turn loop continues after its last staged
  turn instead of starting over;
- a finished sibling is sealed (durable before ``run`` returns) and returned.

Register it in verl's agent-loop YAML (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: recovering
      _target_: rollout_recovery.adapters.verl.RecoveringAgentLoop
      inner: single_turn_agent        # any registered agent loop
      run_dir: /checkpoints/run-1/rollout_recovery

and make it the default loop (``actor_rollout_ref.rollout.agent.default_agent_loop=recovering``).
Keys and their limits: ``_verl_identity``; one recorder per job: ``_recorder_link``.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

import hydra
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    _agent_loop_registry,
)
from verl.workers.rollout.replica import TokenOutput

from ..errors import ConfigError, InvalidArgumentTypeError
from ..recorder import SiblingOutput, StagedCall
from ._recorder_link import LinkMode, RecorderLink, SealedSibling, link_for
from ._verl_identity import JsonValue, aliases_of, json_value, prompt_key, sibling_of

__all__ = ["RecordingServerManager", "RecoveringAgentLoop"]

logger = logging.getLogger(__name__)

#: ``extra`` namespaces in the journal: what verl needs back that the recorder's own fields
#: do not hold.
_OUTPUT_EXTRA = "verl_output"
_CALL_EXTRA = "verl_call"

#: The arguments verl passes every agent loop that the wrapper's own config adds to; the
#: hydra entry's ``name`` (from the YAML) is the wrapper's, not the inner loop's.
_OWN_KEYS = ("inner", "run_dir", "steps_per_epoch", "recorder", "name")


def _weight_version(value: Any) -> int | None:
    """A weight version as the recorder keeps it (an int >= 0), else None: verl tags a
    call with the server's ``global_steps``, absent (or -1) when it has none."""
    return None if value is None or int(value) < 0 else int(value)


def _floats(values: Sequence[float] | None) -> list[float] | None:
    return None if values is None else [float(x) for x in values]


def _recordable(fields: dict[str, Any], *, path: str, what: str) -> JsonValue | None:
    """``fields`` as JSON, or None (with a warning saying ``what`` and why) when they hold
    something JSON cannot: the journal keeps JSON only."""
    try:
        return json_value(fields, path=path)
    except InvalidArgumentTypeError as error:
        logger.warning("rollout_recovery: %s: %s", what, error)
        return None


def _staged_call(prompt_ids: Sequence[int], output: TokenOutput) -> StagedCall | None:
    """``output`` as a staged call, or None when it holds what the journal cannot
    (routed experts, non-JSON extra fields): that call is not staged and is redone."""
    if output.routed_experts is not None:
        return None
    fields = {
        "stop_reason": output.stop_reason,
        "num_preempted": output.num_preempted,
        "extra_fields": output.extra_fields,
    }
    extra = _recordable(fields, path="$.generate", what="a generate call is not staged")
    if extra is None:
        return None
    return StagedCall(
        prompt_token_ids=[int(t) for t in prompt_ids],
        output_token_ids=[int(t) for t in output.token_ids],
        logprobs=_floats(output.log_probs),
        weight_version=_weight_version(output.extra_fields.get("global_steps")),
        extra={_CALL_EXTRA: extra},
    )


def _token_output(call: StagedCall) -> TokenOutput:
    fields = call.extra[_CALL_EXTRA]
    return TokenOutput(
        token_ids=list(call.output_token_ids),
        log_probs=None if call.logprobs is None else list(call.logprobs),
        stop_reason=fields["stop_reason"],
        num_preempted=fields["num_preempted"],
        extra_fields=dict(fields["extra_fields"]),
    )


class RecordingServerManager:
    """Stands where verl's ``LLMServerClient`` does for one sibling's inner loop.

    ``generate`` answers from the sibling's staged calls when one was made with the same
    prompt tokens (a loop that replays the same turns sends the same prompts), else asks the
    real server and stages the call before returning it. Matching by prompt, not by position,
    keeps a loop that diverged after the kill correct: its new prompts are simply not found.
    """

    def __init__(
        self,
        server: Any,
        link: RecorderLink,
        group_id: str,
        sibling: int,
        staged: Sequence[StagedCall] = (),
    ) -> None:
        self._server = server
        self._link = link
        self._group_id = group_id
        self._sibling = sibling
        self._staged: dict[tuple[int, ...], deque[StagedCall]] = defaultdict(deque)
        for call in staged:
            self._staged[tuple(call.prompt_token_ids)].append(call)
        self.replayed_calls = 0
        self.generated_calls = 0

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any
    ) -> TokenOutput:
        waiting = self._staged.get(tuple(int(t) for t in prompt_ids))
        if waiting:
            self.replayed_calls += 1
            return _token_output(waiting.popleft())
        output: TokenOutput = await self._server.generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw
        )
        self.generated_calls += 1
        call = _staged_call(prompt_ids, output)
        if call is not None:
            await self._link.stage_call(self._group_id, self._sibling, call)
        return output

    def __getattr__(self, name: str) -> Any:
        # Anything else a loop reads from its server manager (verl's clients have more than
        # generate) is the real server's.
        return getattr(self._server, name)


def _sibling_output(output: AgentLoopOutput) -> SiblingOutput | None:
    """``output`` as the recorder stores it, or None when it holds what the journal cannot
    (multi-modal data, routed experts, non-JSON extra fields): that sibling is returned
    unsealed and runs again after a restart."""
    if output.multi_modal_data or output.routed_experts is not None:
        return None
    fields = {
        "response_mask": output.response_mask,
        "num_turns": output.num_turns,
        "metrics": output.metrics.model_dump(),
        "extra_fields": output.extra_fields,
        "mm_processor_kwargs": output.mm_processor_kwargs,
    }
    extra = _recordable(fields, path="$.output", what="a sibling is not sealed")
    if extra is None:
        return None
    return SiblingOutput(
        prompt_token_ids=[int(t) for t in output.prompt_ids],
        completion_token_ids=[int(t) for t in output.response_ids],
        logprobs=_floats(output.response_logprobs),
        reward=None if output.reward_score is None else float(output.reward_score),
        weight_version=_weight_version(output.extra_fields.get("max_global_steps")),
        extra={_OUTPUT_EXTRA: extra},
    )


def _agent_loop_output(sealed: SealedSibling) -> AgentLoopOutput:
    """The stored sibling as the output the inner loop returned before the kill."""
    fields = sealed.extra[_OUTPUT_EXTRA]
    return AgentLoopOutput(
        prompt_ids=list(sealed.prompt_token_ids),
        response_ids=list(sealed.completion_token_ids),
        response_mask=list(fields["response_mask"]),
        response_logprobs=None if sealed.logprobs is None else list(sealed.logprobs),
        reward_score=sealed.reward,
        num_turns=fields["num_turns"],
        metrics=AgentLoopMetrics(**fields["metrics"]),
        extra_fields=dict(fields["extra_fields"]),
        mm_processor_kwargs=fields["mm_processor_kwargs"],
        multi_modal_data={},
    )


class RecoveringAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """An agent loop that records its sibling in a recorder and answers a sealed one from it.

    Config (the hydra entry's keys besides ``_target_``):

    - ``inner``: the registered agent loop to run (``single_turn_agent``, ``tool_agent``, a
      user's own);
    - ``run_dir``: the recorder's run directory (one per training run; put it beside the
      trainer's checkpoints);
    - ``steps_per_epoch``: ``len(train_dataset) // data.train_batch_size``, needed when the
      run has more than one epoch and the rows carry no ``epoch`` (see ``_verl_identity``);
    - ``recorder``: ``"auto"`` (a named Ray actor under Ray, else this process),
      ``"process"`` or ``"ray"`` (see ``_recorder_link``).

    The group size is ``actor_rollout_ref.rollout.n``.
    """

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        hf_model_type: str | None = None,
        *,
        inner: str,
        run_dir: str,
        steps_per_epoch: int | None = None,
        recorder: LinkMode = "auto",
        **kwargs: Any,
    ) -> None:
        # AgentLoopBase.__init__ is not called: it builds the tokenization machinery the
        # inner loop builds for itself; the wrapper keeps the arguments to build that loop.
        self._inner_name = inner
        self._server = server_manager
        self._loop_arguments = {
            "trainer_config": trainer_config,
            "tokenizer": tokenizer,
            "processor": processor,
            "dataset_cls": dataset_cls,
            "data_config": data_config,
            "hf_model_type": hf_model_type,
            **{k: v for k, v in kwargs.items() if k not in _OWN_KEYS},
        }
        config = trainer_config.config
        self._group_size = int(config.actor_rollout_ref.rollout.n)
        self._total_epochs = int(config.get("trainer", {}).get("total_epochs", 1))
        self._steps_per_epoch = None if steps_per_epoch is None else int(steps_per_epoch)
        self._run_dir = str(run_dir)
        self._link_mode: LinkMode = recorder

    def _inner_loop(self, server_manager: RecordingServerManager) -> Any:
        if self._inner_name not in _agent_loop_registry:
            raise ConfigError(
                f"inner agent loop {self._inner_name!r} is not registered (registered: "
                f"{sorted(_agent_loop_registry)}): import its module or list it in "
                "agent_loop_config_path",
                path="$.inner",
            )
        return hydra.utils.instantiate(
            config=_agent_loop_registry[self._inner_name],
            server_manager=server_manager,
            **self._loop_arguments,
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        sibling = sibling_of(kwargs, self._group_size)
        key = prompt_key(
            kwargs, steps_per_epoch=self._steps_per_epoch, total_epochs=self._total_epochs
        )
        link = link_for(self._run_dir, self._group_size, mode=self._link_mode)
        prompt = json_value(kwargs.get("raw_prompt"), path="$.raw_prompt")
        taken = await link.take(key, prompt, aliases_of(kwargs))
        sealed = taken.sealed.get(sibling)
        if sealed is not None:
            return _agent_loop_output(sealed)
        manager = RecordingServerManager(
            self._server, link, taken.group_id, sibling, taken.staged.get(sibling, ())
        )
        output: AgentLoopOutput = await self._inner_loop(manager).run(sampling_params, **kwargs)
        record = _sibling_output(output)
        if record is not None:
            await link.seal(taken.group_id, sibling, record)
        return output

