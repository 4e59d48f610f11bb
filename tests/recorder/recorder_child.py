"""A foreign loop the crash test kills: seals siblings with fresh random tokens, marks
groups trained and checkpoints saved, and prints each seal once ``seal`` has returned.

    python recorder_child.py RUN_DIR KEYS

It resumes from the newest checkpoint the journal names (what a trainer that saved it
would do), and prints ``ACK <key> <sibling> <token,token,...>`` after each acknowledged
seal, ``DONE`` at the end.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rollout_recovery.history import AuditTrail, records
from rollout_recovery.recorder import Recorder, SiblingOutput, StagedCall
from rollout_recovery.rundir import RunDirectory

GROUP_SIZE = 3


def newest_tag(run_dir: Path) -> str | None:
    run = RunDirectory(run_dir)
    if not run.events.exists():
        return None
    tags = [
        record.trainer_checkpoint
        for record in AuditTrail.read_history(run)
        if isinstance(record, records.CheckpointCommitted) and record.trainer_checkpoint
    ]
    return tags[-1] if tags else None


def main() -> int:
    run_dir, keys = Path(sys.argv[1]), int(sys.argv[2])
    tag = newest_tag(run_dir)
    with Recorder.open(run_dir, group_size=GROUP_SIZE, resume_checkpoint=tag) as rec:
        pending: list[str] = []
        for number in range(keys):
            key = f"0:{number}"
            taken = rec.take(key, {"row": number})
            if taken.trained:
                continue
            for sibling in taken.unsealed:
                tokens = list(os.urandom(4))
                rec.stage_call(taken.group_id, sibling, StagedCall([number], tokens[:2]))
                rec.seal(taken.group_id, sibling, SiblingOutput([number], tokens))
                print(f"ACK {key} {sibling} {','.join(map(str, tokens))}", flush=True)
            pending.append(taken.group_id)
            if len(pending) == 2:
                rec.mark_trained(pending, step=number)
                pending = []
                rec.mark_checkpoint(f"ckpt-{number}", step=number)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
