"""One prompt group through verl's own ``AgentLoopWorker``, as a child the tests kill and rerun.

    python verl_group_child.py --model DIR --log FILE --run LABEL [--block-after K]
        [--recover RUN_DIR] [--weight-version V] [--loop NAME]

Runs the ``rollout.n`` siblings of one prompt the way verl's V1 worker does
(``AgentLoopWorkerTQ._run_prompt``: one ``_run_agent_loop`` task per sibling, with ``uid``,
``session_id``, ``index`` and ``global_steps`` among the sample's fields), through the
registered ``single_turn_agent`` loop (verl's ``SingleTurnAgentLoop``: a user's loop) and the
worker's real post-processing. The worker is set up field by field with a fake server
manager, the way verl's own ``tests/experimental/agent_loop/*_on_cpu.py`` tests build it:
there is no CPU rollout server to stand behind a real one.

FILE gets one JSON line per generate call the fake server manager answers and one per
sibling verl has post-processed (which also prints ``FINISHED <session>``). With ``--block-after K``
the calls after the K-th print ``BLOCKED`` and wait on stdin: the parent kills the
child there, with K siblings finished and the rest in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # verl is imported by main(): the test imports this module for its markers
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.replica import TokenOutput

USER_LOOP = "single_turn_agent"
RECOVERING = "recovering"
TWO_TURNS = "two_turn_agent"
FINISHED = "FINISHED"
BLOCKED = "BLOCKED"
PROMPT_LENGTH, RESPONSE_LENGTH = 32, 16
#: The trainer step whose weights the fake server "generates" with: what a real server
#: reports in ``extra_fields`` and verl's off-policy filter reads.
WEIGHT_VERSION = 5


def log_line(log: int, **fields: Any) -> None:
    """One write per line on an O_APPEND descriptor: a kill leaves whole lines only."""
    os.write(log, (json.dumps(fields) + "\n").encode())


class CountingServerManager:
    """Stands where verl's ``LLMServerClient`` does: ``generate`` returns a ``TokenOutput``.

    Each call's tokens depend on its prompt and its call number, and it carries the weight
    version tags the real client sets (``global_steps`` and ``min``/``max_global_steps``).
    """

    def __init__(
        self, log: int, run: str, block_after: int | None, weight_version: int = WEIGHT_VERSION
    ) -> None:
        self.log, self.run, self.block_after = log, run, block_after
        self.weight_version = weight_version
        self.calls = 0

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        call = self.calls
        if self.block_after is not None and call > self.block_after:
            print(BLOCKED, flush=True)
            # The parent holds stdin open and never writes: we wait here for its SIGKILL (and
            # exit on EOF should the parent die first, instead of waiting forever).
            await asyncio.to_thread(sys.stdin.read)
            raise SystemExit("stdin closed while blocked in a generate call")
        tokens = [(sum(prompt_ids) + 7 * call + i) % 200 + 10 for i in range(4)] + [1]
        log_line(self.log, event="generate", run=self.run, call=call, tokens=len(tokens))
        tags = {"global_steps": self.weight_version}
        tags.update(min_global_steps=self.weight_version, max_global_steps=self.weight_version)
        return TokenOutput(token_ids=tokens, log_probs=[-0.5] * len(tokens), extra_fields=tags)


def worker(model: Path, server: CountingServerManager, *, n: int) -> AgentLoopWorker:
    """verl's worker with the fields ``_run_agent_loop`` and its post-processing read."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    # Importing single_turn_agent_loop registers verl's "single_turn_agent".
    from verl.experimental.agent_loop import single_turn_agent_loop  # noqa: F401
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "n": n,
                    "prompt_length": PROMPT_LENGTH,
                    "response_length": RESPONSE_LENGTH,
                    "multi_turn": {"tool_config_path": None},
                },
                "model": {"path": str(model), "tokenizer_path": str(model)},
            },
            "data": {"tool_config_path": None, "apply_chat_template_kwargs": {}},
        }
    )
    w = object.__new__(AgentLoopWorker)
    w.config = config
    w.rollout_config = config.actor_rollout_ref.rollout
    w.llm_client = server
    w.tokenizer = AutoTokenizer.from_pretrained(model)
    w.processor = None
    w.hf_model_type = None
    w.dataset_cls = RLHFDataset
    w.tools = []
    w.mm_processor_kwargs = {}
    w.reward_loop_worker_handles = None
    w.distillation_enabled = False
    return w


def register_two_turns() -> None:
    """verl's registry gets ``two_turn_agent``: a user loop that makes two generate calls,
    the second on the first's prompt and answer (a multi-turn loop's shape, no tools)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

    class TwoTurnLoop(AgentLoopBase):  # type: ignore[misc]
        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
            prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
            context, response, logprobs = list(prompt_ids), [], []
            outputs = []
            for turn in range(2):
                out = await self.server_manager.generate(
                    f"turn-{turn}", prompt_ids=context, sampling_params=sampling_params
                )
                outputs.append(out)
                context += out.token_ids
                response += out.token_ids
                logprobs += out.log_probs
            return AgentLoopOutput(
                prompt_ids=prompt_ids,
                response_ids=response[:RESPONSE_LENGTH],
                response_mask=[1] * len(response[:RESPONSE_LENGTH]),
                response_logprobs=logprobs[:RESPONSE_LENGTH],
                num_turns=3,
                metrics={},
                extra_fields={
                    "min_global_steps": outputs[0].extra_fields["min_global_steps"],
                    "max_global_steps": outputs[-1].extra_fields["max_global_steps"],
                },
            )

    # hydra builds a registered loop from its module and name: make it a module global.
    TwoTurnLoop.__qualname__ = "TwoTurnLoop"
    globals()["TwoTurnLoop"] = TwoTurnLoop
    register(TWO_TURNS)(TwoTurnLoop)


async def run_group(
    w: AgentLoopWorker,
    log: int,
    run: str,
    *,
    n: int,
    index: int,
    uid: str,
    global_steps: int,
    agent_name: str = USER_LOOP,
) -> None:
    sample = {
        "raw_prompt": [{"role": "user", "content": f"Count on from {index}:"}],
        # RLHFDataset copies extra_info's index to "index" (and stamps 0 when there is none).
        "extra_info": {"index": index, "split": "train"},
        "index": index,
        "uid": uid,
        "global_steps": global_steps,
    }

    async def sibling(session_id: int) -> None:
        trajectory = {"step": global_steps, "sample_index": index, "rollout_n": session_id,
                      "validate": False}  # fmt: skip
        output = await w._run_agent_loop(
            {"temperature": 1.0}, trajectory, agent_name=agent_name, session_id=session_id, **sample
        )
        tags = {k: output.extra_fields.get(k) for k in ("min_global_steps", "max_global_steps")}
        tokens = int(output.response_mask.sum())
        response = output.response_ids[0][: output.response_mask.shape[1]].tolist()
        log_line(log, event="finished", run=run, session=session_id, response_tokens=tokens,
                 response=response, **tags)  # fmt: skip
        print(f"{FINISHED} {session_id}", flush=True)

    await asyncio.gather(*(sibling(i) for i in range(n)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--block-after", type=int)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--recover", type=Path)
    parser.add_argument("--weight-version", type=int, default=WEIGHT_VERSION)
    parser.add_argument("--loop", default=USER_LOOP, choices=[USER_LOOP, TWO_TURNS])
    # The same dataset row and uid on the rerun by default: verl's V1 trainer re-issues a
    # restored in-flight prompt under its uid (``_reissue_inflight_prompts``), all n sessions
    # of it; a prompt fetched again from the dataloader gets a new uid.
    parser.add_argument("--uid", default="uid-7")
    args = parser.parse_args()
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    server = CountingServerManager(log, args.run, args.block_after, args.weight_version)
    w = worker(args.model, server, n=args.n)
    register_two_turns()
    agent_name = args.loop
    if args.recover is not None:
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

        # What the YAML entry in agent_loop_config_path puts in verl's registry.
        _agent_loop_registry[RECOVERING] = {
            "_target_": "rollout_recovery.adapters.verl.RecoveringAgentLoop",
            "inner": args.loop,
            "run_dir": str(args.recover),
            "recorder": "process",
        }
        agent_name = RECOVERING
    group = run_group(
        w, log, args.run, n=args.n, index=7, uid=args.uid, global_steps=5, agent_name=agent_name
    )
    asyncio.run(group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
