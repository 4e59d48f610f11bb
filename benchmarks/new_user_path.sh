#!/usr/bin/env bash
# A new user's first hour, timed stage by stage (issue 27, "Measured"; docs/benchmarks.md,
# "A new user's path"): a fresh clone, a fresh python3.11 venv, the README's LLM install
# commands as written, the math example run, killed with kill -9 partway, resumed with the
# same command, audited, exported, and the export loaded with transformers to complete a
# prompt of the dataset.
#
#   bash benchmarks/new_user_path.sh [REPO] [WORKDIR] [KILL_AT_STEP]
#   TORCH_FIND_LINKS=/opt/wheels bash benchmarks/new_user_path.sh ...   # no PyTorch index
#
# REPO is what `git clone` reads (default: this checkout), WORKDIR is wiped first (default
# /tmp/new-user). HOME is WORKDIR/home, so no pip, Hugging Face or model cache of this
# machine helps. Each stage prints one "TIMED <stage> <seconds>" line on stderr.
set -euo pipefail

repo=${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
work=${2:-/tmp/new-user}
kill_at=${3:-75}
config=examples/math/tiny-llama-math.toml

rm -rf "$work"
mkdir -p "$work/home"
export HOME=$work/home
cd "$work"

now() { date +%s.%N; }
timed() { # timed STAGE START: one line per stage
  printf 'TIMED %-22s %7.1f s\n' "$1" "$(echo "$(now) - $2" | bc)" >&2
}

start=$(now)
git clone -q "$repo" clone
cd clone
timed clone "$start"

# The README's "Real language models" section, its two commands as written. Where the
# PyTorch index cannot be reached (a machine that reaches PyPI only), TORCH_FIND_LINKS
# names a directory holding the CPU wheel of torch 2.13.0, the README's other way.
start=$(now)
python3.11 -m venv .venv
. .venv/bin/activate
timed venv "$start"
start=$(now)
if ! pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
  > "$work/install-torch.log" 2>&1; then
  timed "torch (index): FAILED" "$start"
  tail -2 "$work/install-torch.log" >&2
  [ -n "${TORCH_FIND_LINKS:-}" ] || exit 1
  start=$(now)
  pip install torch==2.13.0 --find-links "$TORCH_FIND_LINKS" >> "$work/install-torch.log" 2>&1
fi
timed "torch" "$start"
start=$(now)
pip install '.[llm]' > "$work/install-llm.log" 2>&1
timed "install .[llm]" "$start"

# The run, in a session of its own so nothing of it outlives this script, killed with
# SIGKILL (its process alone, as `kill -9 PID` does) once it printed step $kill_at.
start=$(now)
setsid rollout-recovery run --config "$config" --out runs/math > "$work/run1.log" 2>&1 &
pid=$!
until grep -q "^step $kill_at " "$work/run1.log"; do
  kill -0 "$pid" 2> /dev/null || { echo "the run ended before step $kill_at" >&2; exit 1; }
  sleep 0.2 # polling a log: this harness is a user watching the console
done
kill -9 "$pid"
wait "$pid" || echo "first run: exit $? (137 = SIGKILL)" >&2
timed "run to step $kill_at + kill" "$start"
leftover=$(pgrep -s "$pid" || true)
[ -z "$leftover" ] || { echo "left running after kill -9: $leftover" >&2; kill -9 -- "-$pid"; }

start=$(now)
rollout-recovery run --config "$config" --out runs/math > "$work/run2.log" 2>&1
timed "resume to the end" "$start"
grep -E "resumed from|mean reward" "$work/run2.log" >&2 || true

start=$(now)
rollout-recovery audit runs/math > "$work/audit.log" 2>&1
timed audit "$start"
grep -E "^audit|PASS|FAIL|dataset" "$work/audit.log" >&2 || true

start=$(now)
rollout-recovery export runs/math runs/math-model > "$work/export.log" 2>&1
timed export "$start"

start=$(now)
python - > "$work/generate.log" 2>&1 << 'EOF'
import json

from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("runs/math-model")
tokenizer = AutoTokenizer.from_pretrained("runs/math-model")
with open("examples/math/arithmetic.jsonl") as rows:
    row = json.loads(rows.readlines()[7])
chat = [{"role": "user", "content": row["prompt"]}]
text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
out = model.generate(**ids, max_new_tokens=2, do_sample=False)
completion = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
print(f"prompt {row['prompt']!r} answer {row['answer']} completion {completion!r}")
EOF
timed "load + generate" "$start"
cat "$work/generate.log" >&2

python - runs/math/metrics.jsonl >&2 << 'EOF'
import json
import sys

steps = {}
for line in open(sys.argv[1]):
    record = json.loads(line)
    steps[record["step"]] = record["mean_reward"]  # a step trained again: its last value
rewards = [steps[s] for s in sorted(steps)]
tenth = max(1, len(rewards) // 10)
first, last = sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth
print(f"steps {len(rewards)}: mean reward first tenth {first:.3f}, last tenth {last:.3f}")
EOF
