"""The torch GRPO trainer: the objective, clipping, bounds, refusals, snapshots and state."""

from __future__ import annotations

import dataclasses
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from llm_support import TARGET, assert_tensors_equal, fixed_batch, on_policy_batch, sample_row

from rollout_recovery.errors import InvalidArgumentError, InvalidOperationError, InvalidStateError
from rollout_recovery.llm._emit_task import EmitTokenTask
from rollout_recovery.llm._trainer import (
    MODEL_STATE_FILE,
    OPTIMIZER_STATE_FILE,
    TRAINER_STATE_FILE,
    TorchGRPOTrainer,
)
from rollout_recovery.llm._weights import TorchWeights
from rollout_recovery.policy import Trainer, TrainSample


def _trainer(model_dir: Path, **kwargs: object) -> TorchGRPOTrainer:
    options: dict[str, object] = {"seed": 0, "learning_rate": 1e-2}
    options.update(kwargs)
    return TorchGRPOTrainer(model_dir, **options)  # type: ignore[arg-type]


def _task(trainer: TorchGRPOTrainer) -> EmitTokenTask:
    return EmitTokenTask(256, seed=0, vocab_size=trainer.vocab_size, target_token=TARGET)


def test_it_is_a_trainer_with_the_models_vocabulary(tiny_model_dir: Path) -> None:
    trainer: Trainer = _trainer(tiny_model_dir)
    assert trainer.weight_version == 0
    assert isinstance(trainer.weights(), TorchWeights)
    assert isinstance(trainer, TorchGRPOTrainer) and trainer.vocab_size == 333


def test_the_loss_gradient_is_the_policy_gradient_inside_the_clip(tiny_model_dir: Path) -> None:
    """On policy (ratio 1) the clipped objective's gradient is -sum(A * grad logp) / n: an
    independent autograd of that formula must agree with the trainer's update direction."""
    trainer = _trainer(tiny_model_dir, learning_rate=1e-3, max_grad_norm=None)
    samples, _ = on_policy_batch(trainer, _task(trainer), step=0, prompts=2, group=3)
    # Make the advantages non-degenerate whatever the rewards were.
    samples = [
        dataclasses.replace(s, advantage=a)
        for s, a in zip(samples, np.linspace(-1, 1, 6), strict=True)
    ]
    model = trainer.skeleton.build(trainer.weights())
    params = dict(model.named_parameters())
    for p in params.values():
        p.requires_grad_(True)
    n = sum(int(s.token_mask.sum()) for s in samples)
    objective = torch.zeros(())
    for s in samples:
        ids = torch.from_numpy(s.token_ids.astype(np.int64))[None]
        logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
        chosen = logps.gather(1, ids[0, 1:, None]).squeeze(1)
        objective = (
            objective - (chosen * torch.from_numpy(s.token_mask[1:])).sum() * s.advantage / n
        )
    objective.backward()
    expected = {name: p.grad.clone() for name, p in params.items() if p.grad is not None}
    metrics = trainer.train_step(samples)
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["clip_fraction"] == 0.0
    norm = torch.sqrt(sum((g * g).sum() for g in expected.values()))
    assert metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    # Adam's first step moves every parameter by -lr * sign(grad) (up to eps).
    after = trainer.named_parameters()
    for name, grad in expected.items():
        big = grad.abs() > 1e-6
        moved = after[name] - params[name].detach()
        assert torch.equal(torch.sign(moved[big]), -torch.sign(grad[big])), name


def test_tokens_outside_the_clip_get_no_gradient(tiny_model_dir: Path) -> None:
    """Behaviour logprobs far below the current ones: ratio > 1 + eps, and with a positive
    advantage the clipped term wins, so nothing moves."""
    trainer = _trainer(tiny_model_dir)
    samples, _ = on_policy_batch(trainer, _task(trainer), step=0, prompts=2, group=2)
    stale = [
        dataclasses.replace(s, logprobs=s.logprobs - 3.0 * s.token_mask, advantage=1.0)
        for s in samples
    ]
    before = trainer.named_parameters()
    metrics = trainer.train_step(stale)
    assert metrics["clip_fraction"] == 1.0 and metrics["mean_ratio"] > 1.2
    assert metrics["grad_norm"] == 0.0 and metrics["skipped"] == 0.0
    assert_tensors_equal(trainer.named_parameters(), before)
    # The same samples with a negative advantage: the unclipped term is the minimum.
    flipped = [dataclasses.replace(s, advantage=-1.0) for s in stale]
    assert trainer.train_step(flipped)["grad_norm"] > 0.0


def test_micro_batches_accumulate_to_the_full_batch_update(tiny_model_dir: Path) -> None:
    # adam_eps 1: the first update is about lr * grad, linear in the gradient (with the
    # default eps it is lr * sign(grad), which flips on gradients that are nearly zero).
    samples = fixed_batch()
    options = {"learning_rate": 1.0, "adam_eps": 1.0, "max_grad_norm": None}
    whole = _trainer(tiny_model_dir, **options)
    micro = _trainer(tiny_model_dir, micro_batch_size=2, **options)
    m_whole, m_micro = whole.train_step(samples), micro.train_step(samples)
    for key in ("loss", "grad_norm", "mean_ratio", "tokens"):
        assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-5), key
    a, b = whole.named_parameters(), micro.named_parameters()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)


def test_a_tiny_model_step_is_fast(tiny_model_dir: Path) -> None:
    """32 samples of 16 tokens: well under 0.1 s of CPU per step (measured 0.018 s with one
    torch thread, which the fixture ``one_torch_thread`` sets)."""
    trainer = _trainer(tiny_model_dir)
    samples = fixed_batch(prompt_len=8, count=32, length=8)
    trainer.train_step(samples)  # warm-up
    started = time.process_time()
    for _ in range(5):
        trainer.train_step(samples)
    per_step = (time.process_time() - started) / 5
    assert per_step < 0.1, per_step


def test_an_infinite_behaviour_logprob_is_bounded_not_propagated(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    samples = fixed_batch()
    broken = samples[0].logprobs.copy()
    broken[np.flatnonzero(samples[0].token_mask)[0]] = -np.inf
    # A negative advantage: unbounded, the ratio's infinity would win the min and make the
    # loss infinite (a positive one would lose to the clipped term either way).
    samples[0] = dataclasses.replace(samples[0], logprobs=broken, advantage=-0.5)
    metrics = trainer.train_step(samples)
    assert metrics["skipped"] == 0.0 and metrics["bounded_fraction"] > 0.0
    assert all(torch.isfinite(p).all() for p in trainer.named_parameters().values())


def test_a_non_finite_step_is_skipped_and_the_version_advances(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    samples = [
        dataclasses.replace(s, advantage=3e38 * (1 if s.advantage > 0 else -1))
        for s in fixed_batch()
    ]
    before_params = trainer.named_parameters()
    before_state = trainer.state_files()
    metrics = trainer.train_step(samples)
    assert metrics["skipped"] == 1.0
    assert trainer.weight_version == 1
    assert_tensors_equal(trainer.named_parameters(), before_params)
    # No optimizer state was made or changed either.
    assert trainer.state_files()[OPTIMIZER_STATE_FILE] == before_state[OPTIMIZER_STATE_FILE]
    assert trainer.train_step(fixed_batch())["skipped"] == 0.0  # and training goes on


def test_an_empty_batch_only_advances_the_version(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    before = trainer.state_files()
    metrics = trainer.train_step([])
    assert trainer.weight_version == 1 and metrics["tokens"] == 0.0
    after = trainer.state_files()
    assert after[MODEL_STATE_FILE] == before[MODEL_STATE_FILE]
    assert after[OPTIMIZER_STATE_FILE] == before[OPTIMIZER_STATE_FILE]


def test_the_controller_names_the_new_version(tiny_model_dir: Path) -> None:
    """After a restore rolled training back, the next step skips the used versions."""
    trainer = _trainer(tiny_model_dir)
    trainer.train_step([], version=5)
    assert trainer.weight_version == 5
    before = trainer.state_files()
    for bad in (5, 4, True, "6"):
        with pytest.raises(InvalidArgumentError, match="version"):
            trainer.train_step(fixed_batch(), version=bad)  # type: ignore[arg-type]
    assert trainer.weight_version == 5 and trainer.state_files() == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: dataclasses.replace(s, token_ids=s.token_ids + np.int32(400)),
            "outside the model's vocabulary",
        ),
        (
            lambda s: dataclasses.replace(s, token_ids=s.token_ids * np.int32(-1)),
            "outside the model's vocabulary",
        ),
        (lambda s: dataclasses.replace(s, logprobs=s.logprobs[:-1]), "differ in length"),
        (lambda s: dataclasses.replace(s, advantage=float("nan")), "non-finite advantage"),
        (lambda s: dataclasses.replace(s, token_mask=np.ones_like(s.token_mask)), "position 0"),
        (
            lambda s: dataclasses.replace(s, token_mask=s.token_mask * np.float32(0.5)),
            "only 0.0 and 1.0",
        ),
        (lambda s: dataclasses.replace(s, logprobs=s.logprobs * np.float32(np.nan)), "NaN"),
    ],
)
def test_a_bad_sample_is_refused_before_anything_changes(
    tiny_model_dir: Path, change: object, message: str
) -> None:
    trainer = _trainer(tiny_model_dir)
    samples = fixed_batch()
    samples[-1] = change(samples[-1])  # type: ignore[operator]
    before = trainer.state_files()
    with pytest.raises(InvalidArgumentError, match=message) as raised:
        trainer.train_step(samples)
    assert "sample 5" in str(raised.value)
    assert trainer.weight_version == 0
    assert trainer.state_files() == before


def test_weights_are_an_immutable_snapshot_per_version(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    first = trainer.weights()
    assert trainer.weights() is first and first.version == 0
    kept = {name: t.clone() for name, t in first.tensors.items()}
    trainer.train_step(fixed_batch())
    second = trainer.weights()
    assert second.version == 1 and second is not first
    assert_tensors_equal(first.tensors, kept)  # training did not reach the old snapshot
    assert any(not torch.equal(first.tensors[n], second.tensors[n]) for n in kept)
    assert "lm_head.weight" not in second.tensors  # tied to the embedding, as in a checkpoint
    assert second.num_parameters == 338176
    restored = TorchWeights.from_safetensors_bytes(second.safetensors_bytes())
    assert restored.version == 1
    assert_tensors_equal(restored.tensors, second.tensors)
    bf16 = TorchWeights.from_safetensors_bytes(second.safetensors_bytes(torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 for t in bf16.tensors.values())
    with pytest.raises(InvalidStateError):
        TorchWeights.from_safetensors_bytes(b"not safetensors")


def _train(trainer: TorchGRPOTrainer, steps: range) -> None:
    # Off-policy samples with non-zero advantages, different at every step: on-policy ones
    # from the untrained model mostly score 0 everywhere, and a zero gradient would make
    # any state look restored.
    for step in steps:
        metrics = trainer.train_step(fixed_batch(seed=step))
        assert metrics["grad_norm"] > 0.0


@pytest.mark.parametrize("model", ["tiny_model_dir", "dropout_model_dir"])
def test_state_files_resume_bit_for_bit(model: str, request: pytest.FixtureRequest) -> None:
    """k steps, save, m more; a fresh trainer loaded from the save and trained the same m
    steps ends with bit-identical parameters, optimizer state and RNG state. With dropout
    the trainer's torch RNG decides the masks, so the RNG state has to come back too."""
    model_dir: Path = request.getfixturevalue(model)
    original = _trainer(model_dir, micro_batch_size=4)
    _train(original, range(3))
    saved = original.state_files()
    assert set(saved) == {MODEL_STATE_FILE, OPTIMIZER_STATE_FILE, TRAINER_STATE_FILE}
    assert json.loads(saved[TRAINER_STATE_FILE])["version"] == 3
    _train(original, range(3, 6))

    resumed = _trainer(model_dir, micro_batch_size=4, seed=99)  # the seed is state, not config
    resumed.load_state_files(saved)
    assert resumed.weight_version == 3
    _train(resumed, range(3, 6))
    assert resumed.weight_version == original.weight_version == 6
    assert_tensors_equal(resumed.named_parameters(), original.named_parameters())
    assert resumed.state_files() == original.state_files()


def test_rng_state_matters_with_dropout(dropout_model_dir: Path) -> None:
    """Guards the test above: without the RNG state the dropout run diverges."""
    original = _trainer(dropout_model_dir)
    _train(original, range(2))
    saved = original.state_files()
    _train(original, range(2, 4))
    other = _trainer(dropout_model_dir)
    other.load_state_files(saved)
    other.train_step([])  # an empty step draws nothing: still identical after it
    meta = json.loads(saved[TRAINER_STATE_FILE])
    meta["torch_rng"] = json.loads(
        _trainer(dropout_model_dir, seed=5).state_files()[TRAINER_STATE_FILE]
    )["torch_rng"]
    reseeded = _trainer(dropout_model_dir)
    reseeded.load_state_files({**saved, TRAINER_STATE_FILE: json.dumps(meta).encode()})
    _train(reseeded, range(2, 4))
    a, b = reseeded.named_parameters(), original.named_parameters()
    assert any(not torch.equal(a[name], b[name]) for name in a)


def test_numpy_state_resumes_bit_for_bit_through_npz(tiny_model_dir: Path) -> None:
    """state() as a checkpoint of a trainer without state files saves it (policy.npz, no
    pickle)."""
    original = _trainer(tiny_model_dir)
    _train(original, range(2))
    buffer = io.BytesIO()
    np.savez(buffer, **original.state())
    _train(original, range(2, 4))
    with np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False) as npz:
        state = {name: npz[name] for name in npz.files}
    assert state["version"] == 2 and state["trainer_json"].dtype == np.uint8
    assert "adam_m.model.embed_tokens.weight" in state and "param.lm_head.weight" not in state
    resumed = _trainer(tiny_model_dir, seed=7)
    resumed.load_state(state)
    _train(resumed, range(2, 4))
    assert resumed.state_files() == original.state_files()


def test_own_rngs_are_restored(tiny_model_dir: Path) -> None:
    original = _trainer(tiny_model_dir)
    original.numpy_rng.random(3)
    original.python_rng.random()
    saved = original.state_files()
    expected = (original.numpy_rng.random(4).tolist(), original.python_rng.random())
    resumed = _trainer(tiny_model_dir, seed=1)
    resumed.load_state_files(saved)
    assert (resumed.numpy_rng.random(4).tolist(), resumed.python_rng.random()) == expected


def _corrupt(saved: dict[str, bytes], name: str, change: object) -> dict[str, bytes]:
    from safetensors.torch import load, save

    if name == TRAINER_STATE_FILE:
        meta = json.loads(saved[name])
        change(meta)  # type: ignore[operator]
        return {**saved, name: json.dumps(meta).encode()}
    tensors = dict(load(saved[name]))
    change(tensors)  # type: ignore[operator]
    return {**saved, name: save(tensors)}


def _set_first(tensors: dict[str, torch.Tensor], value: torch.Tensor | None) -> None:
    first = sorted(tensors)[0]
    if value is None:
        del tensors[first]
    else:
        tensors[first] = value


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        (MODEL_STATE_FILE, lambda t: _set_first(t, None), "missing"),
        (MODEL_STATE_FILE, lambda t: _set_first(t, torch.zeros(3)), "shape"),
        (MODEL_STATE_FILE, lambda t: t.update({k: v.double() for k, v in t.items()}), "float32"),
        (MODEL_STATE_FILE, lambda t: t["model.norm.weight"].fill_(float("nan")), "finite"),
        (OPTIMIZER_STATE_FILE, lambda t: t.update({"bogus.x": torch.zeros(1)}), "unexpected"),
        (OPTIMIZER_STATE_FILE, lambda t: _set_first(t, None), "missing"),
        (OPTIMIZER_STATE_FILE, lambda t: t["exp_avg_sq.model.norm.weight"].fill_(-1.0), ">= 0"),
        (OPTIMIZER_STATE_FILE, lambda t: t["step.model.norm.weight"].fill_(0.5), "positive count"),
        (TRAINER_STATE_FILE, lambda m: m.update(version=-1), "version"),
        (TRAINER_STATE_FILE, lambda m: m.update(extra=1), "unreadable"),
        (TRAINER_STATE_FILE, lambda m: m.update(torch_rng="AAAA"), "torch RNG"),
        (TRAINER_STATE_FILE, lambda m: m.update(python_rng=[1, 2]), "RNG state"),
        # Issue 24 item 18: words past what the generators hold were an OverflowError.
        (TRAINER_STATE_FILE, lambda m: m["python_rng"][1].__setitem__(3, 2**70), "RNG state"),
        (TRAINER_STATE_FILE, lambda m: m["numpy_rng"]["state"].update(state=2**200), "RNG"),
        (TRAINER_STATE_FILE, lambda m: m["numpy_rng"].update(uinteger=2**70), "RNG state"),
        (TRAINER_STATE_FILE, lambda m: m.update(updates=2**63), "updates"),
        (TRAINER_STATE_FILE, lambda m: m.update(version=2**63), "version"),
    ],
)
def test_a_bad_state_is_refused_and_changes_nothing(
    tiny_model_dir: Path, name: str, change: object, message: str
) -> None:
    donor = _trainer(tiny_model_dir)
    donor.train_step(fixed_batch())
    bad = _corrupt(donor.state_files(), name, change)
    trainer = _trainer(tiny_model_dir)
    before = trainer.state_files()
    with pytest.raises(InvalidStateError, match=message):
        trainer.load_state_files(bad)
    assert trainer.state_files() == before
    with pytest.raises(InvalidStateError, match="must be"):
        trainer.load_state_files({MODEL_STATE_FILE: before[MODEL_STATE_FILE]})


def test_a_bad_numpy_state_is_refused(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    state = trainer.state()
    with pytest.raises(InvalidStateError, match="unexpected key"):
        trainer.load_state({**state, "stray": np.zeros(1)})
    with pytest.raises(InvalidStateError, match="version"):
        trainer.load_state({**state, "version": np.array(5)})
    with pytest.raises(InvalidStateError, match="trainer_json"):
        trainer.load_state({k: v for k, v in state.items() if k != "trainer_json"})
    assert trainer.state_files() == _trainer(tiny_model_dir).state_files()


@pytest.mark.slow
def test_grpo_learns_to_emit_the_target(tiny_model_dir: Path) -> None:
    """The measured curve without the controller: about 0.0 to 1.0 in 20 steps (the job's
    settings, examples/tiny-llama-emit-token.toml). 20 steps, not 30: measured 0.004 mean
    over the first 3 and 0.988 over steps 17-19; the 10 steps after that sat at 1.0 and
    proved nothing more."""
    trainer = _trainer(tiny_model_dir, learning_rate=5e-3, epochs=2)
    task = _task(trainer)
    curve = []
    for step in range(20):
        samples, reward = on_policy_batch(
            trainer, task, step=step, prompts=8, group=4, max_tokens=8
        )
        trainer.train_step(samples)
        curve.append(reward)
    assert np.mean(curve[:3]) < 0.05 and np.mean(curve[-3:]) > 0.8, curve


def test_configuration_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    for bad in (
        {"learning_rate": 0.0},
        {"clip_epsilon": 1.0},
        {"temperature": -1.0},
        {"micro_batch_size": 0},
        {"epochs": 0},
        {"max_grad_norm": float("inf")},
        {"seed": -1},
    ):
        with pytest.raises(InvalidArgumentError):
            _trainer(tiny_model_dir, **bad)
    with pytest.raises(InvalidArgumentError, match=r"config\.json"):
        _trainer(tmp_path)


def test_samples_are_train_samples() -> None:
    # The helper builds what the controller builds: prompt masked, generated tokens trained.
    row = sample_row([0, 7], [9, 9], [-1.0, -2.0], 0.5)
    assert isinstance(row, TrainSample)
    assert row.token_mask.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert row.logprobs.tolist() == [0.0, 0.0, -1.0, -2.0]


def test_a_batch_without_signal_changes_nothing_not_even_by_momentum(
    tiny_model_dir: Path,
) -> None:
    """All advantages zero: the gradient is zero, and AdamW's momentum from the last
    rewarded step must not keep moving the parameters (that drift collapsed runs)."""
    trainer = _trainer(tiny_model_dir)
    trainer.train_step(fixed_batch())
    before = trainer.state_files()
    flat = [dataclasses.replace(s, advantage=0.0) for s in fixed_batch(seed=9)]
    metrics = trainer.train_step(flat)
    assert metrics["no_signal"] == 1.0 and metrics["grad_norm"] == 0.0
    after = trainer.state_files()
    assert after[MODEL_STATE_FILE] == before[MODEL_STATE_FILE]
    assert after[OPTIMIZER_STATE_FILE] == before[OPTIMIZER_STATE_FILE]
    assert trainer.weight_version == 2


def test_staged_state_files_are_the_state_files_of_the_call_however_training_goes_on(
    tiny_model_dir: Path,
) -> None:
    """A background checkpoint's copy (issue 28, item 3): taken now, encoded after more
    steps, it is byte for byte what ``state_files()`` gave at the copy."""
    trainer = _trainer(tiny_model_dir)
    _train(trainer, range(2))
    expected = trainer.state_files()
    encode = trainer.staged_state_files()
    _train(trainer, range(2, 4))
    assert trainer.state_files() != expected  # training went on
    assert encode() == expected
    # And it loads back as the trainer of then, bit for bit.
    again = _trainer(tiny_model_dir)
    again.load_state_files(encode())
    assert again.weight_version == 2 and again.state_files() == expected


def test_a_second_capture_reuses_the_buffers_and_each_encodes_the_state_of_its_call(
    tiny_model_dir: Path,
) -> None:
    """The staging buffers are reused (no fresh memory per checkpoint), yet each capture
    encodes the state of its own call: the first one's, read through before the second
    capture; the second's, after the trainer trained on (and took weight snapshots, as the
    controller's push does between checkpoints). The first one's copy, overwritten by the
    second capture, refuses to encode instead of giving the newer state."""
    trainer = _trainer(tiny_model_dir)
    _train(trainer, range(2))
    first_expected = trainer.state_files()
    first = trainer.staged_state_files()
    assert first() == first_expected
    buffers = {name: t.data_ptr() for name, t in trainer._staging._buffers.items()}
    for step in range(2, 4):
        _train(trainer, range(step, step + 1))
        trainer.weights()
    second_expected = trainer.state_files()
    second = trainer.staged_state_files()
    assert {name: t.data_ptr() for name, t in trainer._staging._buffers.items()} == buffers
    _train(trainer, range(4, 6))
    trainer.weights()
    assert second() == second_expected
    with pytest.raises(InvalidStateError, match="overwritten by a later checkpoint"):
        first()


def test_a_capture_before_the_previous_one_is_encoded_is_refused(tiny_model_dir: Path) -> None:
    """One copy in the buffers at a time: a capture while the previous one waits for its
    encoding (a background write not finished) is refused and changes nothing; once that
    one is encoded, or dropped unread, the next capture goes ahead."""
    trainer = _trainer(tiny_model_dir)
    _train(trainer, range(2))
    expected = trainer.state_files()
    pending = trainer.staged_state_files()
    _train(trainer, range(2, 3))
    with pytest.raises(InvalidOperationError, match="await the previous checkpoint's write"):
        trainer.staged_state_files()
    assert pending() == expected  # the refused capture overwrote nothing
    trainer.staged_state_files()  # read through: free again (this one dropped unread)
    later = trainer.state_files()
    assert trainer.staged_state_files()() == later


def test_snapshots_kept_as_files_are_those_files_and_a_checkpoint_encoded_later_is_exact(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With the vLLM sync as its snapshots' home, each version's snapshot is the file its
    servers load, viewed read-only; training on does not reach it, and a background
    checkpoint staged at version 2 and encoded after versions 3 and 4 were placed (their
    files taking superseded files' pages) is byte for byte the state of version 2."""
    from safetensors import safe_open

    from rollout_recovery.vllm._sync import VllmWeightSync, weights_file_name

    sync = VllmWeightSync(tmp_path / "weights", dtype="float32")
    trainer = _trainer(tiny_model_dir)
    trainer.keep_snapshots_in(sync)
    _train(trainer, range(2))
    snapshot = trainer.weights()
    path = sync.directory / weights_file_name(2)
    with safe_open(str(path), framework="pt") as file:
        assert_tensors_equal({n: file.get_tensor(n) for n in file.keys()}, snapshot.tensors)  # noqa: SIM118
    for tensor in snapshot.tensors.values():  # views of the file, not copies
        assert tensor.untyped_storage().nbytes() == path.stat().st_size
    expected = trainer.state_files()
    encode = trainer.staged_state_files()
    kept = {name: t.clone() for name, t in snapshot.tensors.items()}
    for step in range(2, 5):
        _train(trainer, range(step, step + 1))
        assert trainer.weights().version == step + 1  # placed: the pool would push it
    assert_tensors_equal(snapshot.tensors, kept)
    assert encode() == expected
    sync.close()
