"""The live runner (``drive``): CLI-level smoke runs, headless, and the Renderer on its own."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"  # never open a window in tests
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import numpy as np
import pytest

from agent.drive.config import DEFAULT_SEED, ENV_FPS, DriveConfig, parse_drive_args
from agent.drive.hud import DEFAULT_ACTION_NAMES, Renderer, StepView
from agent.drive.session import run_drive
from agent.train.config import ConfigError


def _parse(*argv: str) -> DriveConfig:
    return parse_drive_args(list(argv))


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    from agent.nn.policy import DrivingPolicy, default_config

    return DrivingPolicy(default_config("carracing", window=8)).save(tmp_path_factory.mktemp("policy") / "tiny.pt")


@pytest.fixture
def cached_load(monkeypatch):
    """Load each policy file once per module (loading no longer rebuilds the ncps wirings, but reusing is still cheaper).

    The first run of the module goes through the real loader; the later runs reuse its policy.
    """
    import agent.actors.loading
    import agent.drive.session  # run_drive loads the policy through its own name

    real = agent.actors.loading.load_policy

    def load(name, device="cpu"):
        key = str(agent.actors.loading.resolve_policy_path(name))
        if key not in _POLICIES:
            _POLICIES[key] = real(name, device)
        return _POLICIES[key]

    monkeypatch.setattr(agent.drive.session, "load_policy", load)


_POLICIES: dict = {}


def test_defaults_match_the_env():
    from envs.carracing import ACTION_NAMES, EVAL_SEED_BASE, FPS

    assert DEFAULT_SEED == EVAL_SEED_BASE
    assert ENV_FPS == FPS
    assert DEFAULT_ACTION_NAMES == ACTION_NAMES
    a = _parse()
    assert (a.env, a.policy, a.episodes, a.track_seed, a.max_steps) == ("carracing", "nac.pt", 1, EVAL_SEED_BASE, None)
    assert (a.headless, a.record, a.scale, a.fps_limit, a.frame_scale) == (False, None, None, 50.0, 6)
    assert (a.overlay, a.saliency, a.traces, a.cam_opacity, a.dump_traces) == (True, True, True, 0.5, None)
    assert (a.device, a.overwrite, a.teacher.expert, a.teacher.start_rule) == ("auto", False, None, True)


def test_drive_headless_prints_the_return(policy_file, cached_load, capsys):
    code = run_drive(_parse("--policy", str(policy_file), "--headless", "--max-steps", "30", "--episodes", "1"))
    out = capsys.readouterr().out
    assert code == 0
    assert "episode 1/1" in out and "return" in out and "steps   30" in out and "mean FPS" in out
    assert "mean return over 1 episode:" in out


def test_drive_falls_back_to_headless_without_a_display(policy_file, cached_load, capsys):
    code = run_drive(_parse("--policy", str(policy_file), "--max-steps", "3"))
    captured = capsys.readouterr()
    assert code == 0
    assert "running headless" in captured.err
    assert "steps    3" in captured.out


def test_drive_records_an_mp4(policy_file, cached_load, tmp_path, capsys):
    import imageio.v2 as imageio

    out = tmp_path / "sub" / "drive.mp4"
    code = run_drive(_parse("--policy", str(policy_file), "--headless", "--max-steps", "30", "--record", str(out)))
    assert code == 0
    assert out.is_file() and out.stat().st_size > 0
    assert "wrote" in capsys.readouterr().out
    reader = imageio.get_reader(str(out), format="FFMPEG")
    try:
        frames = [f for f in reader]
        fps = reader.get_meta_data()["fps"]
    finally:
        reader.close()
    assert abs(len(frames) - 30) <= 2  # one composed frame per step
    assert fps == pytest.approx(ENV_FPS)
    h, w = frames[0].shape[:2]
    assert (w, h) == Renderer().size


def test_ctrl_c_ends_cleanly_and_finishes_the_video(policy_file, cached_load, tmp_path, monkeypatch, capsys):
    import imageio.v2 as imageio

    from agent.actors.rollout import PolicyActor

    act = PolicyActor.act
    calls = []

    def interrupting_act(self, obs, env, info=None):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return act(self, obs, env, info)

    monkeypatch.setattr(PolicyActor, "act", interrupting_act)
    out = tmp_path / "cut.mp4"
    code = run_drive(_parse("--policy", str(policy_file), "--headless", "--max-steps", "30", "--record", str(out)))
    assert code == 130
    assert "interrupted" in capsys.readouterr().out
    reader = imageio.get_reader(str(out), format="FFMPEG")
    try:
        assert abs(sum(1 for _ in reader) - 5) <= 1
    finally:
        reader.close()


def test_window_escape_quits(policy_file, cached_load, monkeypatch, capsys):
    """Windowed mode on SDL's dummy driver: Escape (through the key dispatch) stops the run, exit 0."""
    import pygame

    from agent.drive import session, window

    monkeypatch.setattr(session, "display_unavailable_reason", lambda: None)
    monkeypatch.setattr(window, "_NO_WINDOW_DRIVERS", ())
    present = window.Window.present

    def present_then_escape(self, canvas):
        present(self, canvas)
        pygame.event.post(pygame.event.Event(pygame.KEYDOWN, key=pygame.K_ESCAPE))

    monkeypatch.setattr(window.Window, "present", present_then_escape)
    code = run_drive(_parse("--policy", str(policy_file), "--max-steps", "30", "--episodes", "2", "--fps-limit", "0"))
    out = capsys.readouterr().out
    assert code == 0
    assert "steps    1  mean FPS" in out and "(stopped)" in out and "episode 2/2" not in out
    assert not pygame.display.get_init()


def test_missing_policy_names_the_policies_folder(capsys):
    code = run_drive(_parse("--policy", "no-such-policy.pt", "--headless", "--max-steps", "5"))
    err = capsys.readouterr().err
    assert code != 0
    assert "no-such-policy.pt" in err and "policies" in err


def test_a_layer_the_policy_lacks_is_an_error_even_headless(policy_file, capsys):
    code = run_drive(_parse("--policy", str(policy_file), "--headless", "--max-steps", "5", "--saliency-layer", "conv9"))
    err = capsys.readouterr().err
    assert code == 2 and "saliency layer 'conv9'" in err and "conv1, conv2, conv3" in err


def test_bad_record_suffix_is_an_error(policy_file, tmp_path):
    with pytest.raises(ConfigError, match=r"give a path ending in \.mp4"):
        DriveConfig(policy=str(policy_file), headless=True, record=str(tmp_path / "x.gif"))
    with pytest.raises(SystemExit) as e:  # on the command line tyro reports it
        _parse("--policy", str(policy_file), "--headless", "--record", str(tmp_path / "x.gif"))
    assert e.value.code == 2


def test_existing_outputs_are_refused_without_overwrite(policy_file, tmp_path, capsys):
    from agent.cli import main

    for option, name in (("--record", "x.mp4"), ("--dump-traces", "x.npz")):
        (tmp_path / name).write_bytes(b"keep")
        assert main(["drive", "--policy", str(policy_file), "--headless", option, str(tmp_path / name)]) == 2
        assert f"{option} {tmp_path / name} already exists" in capsys.readouterr().err
        assert (tmp_path / name).read_bytes() == b"keep"
        assert _parse(option, str(tmp_path / name), "--overwrite").overwrite


def _frame(value: int) -> np.ndarray:
    f = np.zeros((96, 96, 3), np.uint8)
    f[..., 1] = value
    f[40:50, 40:50] = (255, 0, 0)
    return f


def test_renderer_size_and_frame_region():
    import pygame

    r = Renderer(scale=6, policy_label="NAC policy tiny.pt")
    w, h = r.size
    assert w % 2 == 0 and h % 2 == 0
    assert r.frame_rect.size == (96 * 6, 96 * 6)
    assert r.panel_rect.width >= 400 and not r.panel_rect.colliderect(r.frame_rect)
    assert not r.hud_rect.colliderect(r.frame_rect) and not r.hud_rect.colliderect(r.panel_rect)

    view = StepView(frame=_frame(50), step=1, action=3, probs=np.full(5, 0.2), speed=12.0, episode_return=3.5,
                    fps=60.0)
    a = r.compose(view).copy()
    assert isinstance(a, pygame.Surface) and a.get_size() == r.size
    b = r.compose(StepView(frame=_frame(200), step=1, action=3, probs=np.full(5, 0.2), speed=12.0,
                           episode_return=3.5, fps=60.0)).copy()
    fa = pygame.surfarray.array3d(a.subsurface(r.frame_rect))
    fb = pygame.surfarray.array3d(b.subsurface(r.frame_rect))
    assert not np.array_equal(fa, fb)
    # nearest-neighbour upscale: frame pixel (x=45, y=45) is red, (x=0, y=0) has the green value
    assert tuple(fa[45 * 6 + 3, 45 * 6 + 3]) == (255, 0, 0)
    assert tuple(fb[2, 2]) == (0, 200, 0)
    # the HUD and panel do not depend on the frame
    assert np.array_equal(pygame.surfarray.array3d(a.subsurface(r.panel_rect)),
                          pygame.surfarray.array3d(b.subsurface(r.panel_rect)))
    assert r.to_rgb().shape == (h, w, 3)


def test_renderer_runs_panel_drawers_and_expert_hud():
    import pygame

    r = Renderer(scale=2, policy_label="expert (privileged state)", show_probs=False)
    seen = []

    def drawer(surface, view):
        seen.append(view.step)
        surface.fill((1, 2, 3))

    r.panels.append(drawer)
    out = r.compose(StepView(frame=_frame(10), step=7, action=1, probs=None))
    assert seen == [7]
    assert tuple(out.get_at((r.panel_rect.centerx, r.panel_rect.centery)))[:3] == (1, 2, 3)
    assert isinstance(out, pygame.Surface)
