"""``--dashboard speed-input``: the speed as a number beside the image (conditional imitation
learning's measured speed), read off the speedometer the env draws, with the whole dashboard strip
blanked before the convolutions (:class:`agent.nn.features.CarRacingCNN`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent.cli import main
from agent.nn.features import CarRacingCNN, dashboard_mask
from agent.nn.policy import DrivingPolicy, default_config
from envs.carracing import SPEEDOMETER_FULL_SCALE, dashboard_rows, draw_speedometer, speedometer_region

TOP, BOTTOM, LEFT, RIGHT = speedometer_region(96, 96)
STRIP = 96 - dashboard_rows(96)


def _frames(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 96, 96, 3), dtype=np.uint8)


def _speed_cnn(seed: int = 0) -> CarRacingCNN:
    """A speed-input CNN whose speed embedding is not at its zero start (as after training)."""
    torch.manual_seed(seed)
    cnn = CarRacingCNN(dashboard="speed-input", motion=True, dropout=0.0).eval()
    torch.nn.init.normal_(cnn.speed_embed[-1].weight)
    return cnn


@pytest.mark.parametrize("motion", [False, True])
def test_the_speed_is_read_exactly_off_the_drawn_speedometer(motion):
    speeds = np.array([0.0, 3.7, 12.3, 19.99, 20.01, 25.07, 64.2, 99.9, SPEEDOMETER_FULL_SCALE, 130.0])
    frames = draw_speedometer(_frames(len(speeds), 1), speeds)
    cnn = CarRacingCNN(dashboard="speed-input", motion=motion)
    x = cnn.preprocess(frames, frames if motion else None)
    read = cnn.read_speed(x).numpy()
    # to 1/255 of a column: 100 / 80 / 255 = 0.005 units/s; above full scale it reads full scale
    assert np.allclose(read, np.minimum(speeds, SPEEDOMETER_FULL_SCALE), atol=0.006)
    assert read[4] > read[3]  # 19.99 and 20.01 apart: the brake floor's two sides


def test_the_mask_blanks_the_whole_strip_and_nothing_above_it():
    mask = dashboard_mask(96, 96, "speed-input")
    assert mask[STRIP:].sum() == 0 and (mask[:STRIP] == 1).all()
    assert np.array_equal(CarRacingCNN(dashboard="speed-input").readable((96, 96)), mask)


def test_no_strip_pixel_reaches_the_convolutions_only_the_speed_does():
    cnn = _speed_cnn()
    a, b = _frames(2, 2), _frames(2, 3)
    b[:, :STRIP] = a[:, :STRIP]  # the same road, another strip (indicators, speed bar, score)
    a, b = draw_speedometer(a, [30.0, 30.0]), draw_speedometer(b, [30.0, 30.0])
    faster = draw_speedometer(a.copy(), [31.0, 31.0])
    with torch.no_grad():
        assert torch.equal(cnn(a, a), cnn(b, b))  # the indicators change nothing
        assert not torch.allclose(cnn(a, a), cnn(faster, faster))  # one unit/s does
        # the change is the embedding's alone: the convolutions' part is the same
        x_a, x_f = cnn.preprocess(a, a), cnn.preprocess(faster, faster)
        assert torch.equal(cnn.cnn(x_a * cnn.dashboard_mask), cnn.cnn(x_f * cnn.dashboard_mask))


def test_training_reaches_the_speed_embedding():
    torch.manual_seed(0)
    policy = DrivingPolicy(default_config("carracing", window=2,
                                          features_kwargs={"dropout": 0.0, "dashboard": "speed-input",
                                                           "motion": True}))
    assert torch.count_nonzero(policy.features.speed_embed[-1].weight) == 0  # the zero start
    frames = draw_speedometer(_frames(4, 4), [5.0, 15.0, 25.0, 45.0]).reshape(2, 2, 96, 96, 3)
    loss = torch.nn.functional.cross_entropy(policy(frames).reshape(4, -1), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert policy.features.speed_embed[-1].weight.grad.abs().sum() > 0


def test_with_dashboard_adds_the_embedding_and_keeps_every_other_weight():
    torch.manual_seed(0)
    meter = DrivingPolicy(default_config("carracing", features_kwargs={"dropout": 0.2, "dashboard": "speedometer",
                                                                       "motion": True})).eval()
    num = meter.with_dashboard("speed-input")
    assert num.features.dashboard == "speed-input" and num.config.features_kwargs["dashboard"] == "speed-input"
    old, new = meter.state_dict(), num.state_dict()
    added = sorted(set(new) - set(old))
    assert added and all(k.startswith("features.speed_embed.") for k in added) and not set(old) - set(new)
    assert all(torch.equal(old[k], new[k]) for k in old)
    assert torch.count_nonzero(new["features.speed_embed.2.weight"]) == 0
    # it starts as the same network without its view of the strip: the speedometer at rest reads the same
    frames = _frames(4, 5)[None]
    frames[..., STRIP:, :, :] = 0
    with torch.no_grad():
        assert torch.allclose(meter(frames), num(frames))
    back = num.with_dashboard("speedometer")  # and back: the embedding is dropped
    assert set(back.state_dict()) == set(old)
    with pytest.raises(ValueError, match="hidden"):
        num.with_dashboard("hidden")


def test_grad_cam_puts_no_heat_on_the_strip():
    from cam_fixture import newest_frame_cam

    from agent.drive.saliency import bottom_share

    torch.manual_seed(0)
    policy = DrivingPolicy(default_config("carracing", window=2,
                                          features_kwargs={"dropout": 0.0, "dashboard": "speed-input",
                                                           "motion": True})).eval()
    torch.nn.init.normal_(policy.features.speed_embed[-1].weight)
    cam = newest_frame_cam(policy, draw_speedometer(_frames(3, 6), [20.0, 22.0, 24.0]))
    assert cam[STRIP:].max() == 0 and cam[:STRIP].max() > 0
    assert bottom_share(cam) == 0.0


def test_a_speed_input_student_trains_dagger_and_evaluates_through_the_cli(tiny_expert, tmp_path):
    import json

    from agent.data.recordings import load_demonstrations
    from agent.actors.loading import reads_speedometer

    rec = tmp_path / "recordings" / "nac-drive" / "demo-v0"
    assert main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--max-steps", "20",
                 "--track-seed", "0", "--out", str(rec)]) == 0
    meter = tmp_path / "meter.pt"
    assert main(["train", "--data", str(rec), "--out", str(meter), "--run-dir", str(tmp_path / "meter"),
                 "--policy.window", "2", "--train.epochs", "1", "--policy.dashboard", "speedometer",
                 "--train.batch-frames", "8", "--train.val-fraction", "0", "--train.tensorboard", ""]) == 0
    out, rounds = tmp_path / "num.pt", tmp_path / "num-dagger"
    assert main(["train", "--data", str(rec), "--out", str(out), "--run-dir", str(tmp_path / "num"), "--init",
                 str(meter), "--policy.dashboard", "speed-input", "--train.epochs", "1", "--train.batch-frames", "8",
                 "--train.val-fraction", "0", "--teacher.expert", str(tiny_expert), "--teacher.start-rule",
                 "--dagger.rounds", "1", "--dagger.episodes", "1", "--dagger.epochs", "1", "--dagger.max-steps", "30",
                 "--dagger.save-rounds", str(rounds), "--train.tensorboard", ""]) == 0
    policy = DrivingPolicy.load(out)
    assert policy.features.dashboard == "speed-input" and reads_speedometer(policy)
    assert torch.count_nonzero(policy.features.speed_embed[-1].weight) > 0  # training moved it
    dag = load_demonstrations(f"{rounds}-r1-v0")
    frames, speeds = dag.frames[0], dag.frame_speeds()[0]
    assert speeds.max() > 0
    assert np.array_equal(draw_speedometer(frames.copy(), speeds), frames)  # DAgger's env drew it
    with torch.no_grad():
        read = policy.features.read_speed(policy.features.preprocess(frames[-5:], frames[-5:])).numpy()
    assert np.allclose(read, np.minimum(speeds[-5:], SPEEDOMETER_FULL_SCALE), atol=0.006)
    js = tmp_path / "e.json"
    assert main(["evaluate", "--policy", str(out), "--episodes", "1", "--max-steps", "15", "--workers", "1",
                 "--track-seed", "5", "--json", str(js)]) == 0
    assert len(json.loads(js.read_text())["returns"]) == 1


def test_speed_sensitivity_counts_the_steps_a_speed_change_flips():
    """docs/speed_sensitivity.py: a fresh switch (zero embedding) never changes its action with the
    speed; a large embedding does; a policy that reads no speedometer is refused."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "speed_sensitivity.py"
    spec = importlib.util.spec_from_file_location("speed_sensitivity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    policy = DrivingPolicy(default_config("carracing", window=2,
                                          features_kwargs={"dropout": 0.0, "dashboard": "speed-input",
                                                           "motion": True})).eval()
    blind = mod.sensitivity(policy, seed=3, steps=6, delta=5.0)
    assert blind["steps"] == 6 and blind["changed"] == {5.0: 0.0, -5.0: 0.0} and not blind["changes"]
    torch.manual_seed(0)  # an attention core, whose output follows its features closely
    loud = DrivingPolicy(default_config("carracing", core="mha", window=2,
                                        features_kwargs={"dropout": 0.0, "dashboard": "speed-input",
                                                         "motion": True})).eval()
    embed = loud.features.speed_embed
    torch.nn.init.normal_(embed[0].weight, std=20.0)
    torch.nn.init.zeros_(embed[0].bias)
    torch.nn.init.normal_(embed[2].weight, std=1.0)
    r = mod.sensitivity(loud, seed=3, steps=6, delta=5.0)
    assert r["changed"][5.0] > 0 and sum(r["changes"].values()) == round(6 * sum(r["changed"].values()))
    assert all(d in (5.0, -5.0) and a != b for a, b, d in r["changes"])
    with pytest.raises(ValueError, match="does not read the speedometer"):
        mod.sensitivity(DrivingPolicy(default_config("carracing", window=2)).eval(), seed=3, steps=2, delta=5.0)
