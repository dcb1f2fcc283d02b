import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
if "NAC_FRAME_CACHE" not in os.environ:  # agent train's frame caches (agent.data.frame_cache): not in ~/.cache
    import atexit
    import shutil
    import tempfile

    os.environ["NAC_FRAME_CACHE"] = tempfile.mkdtemp(prefix="nac-frame-cache-")
    atexit.register(shutil.rmtree, os.environ["NAC_FRAME_CACHE"], True)

import signal  # noqa: E402

# A shell without job control starts background jobs (``cmd &``, ``nohup``) with SIGINT ignored, and
# an ignored signal stays ignored in every child. The Ctrl-C tests need Ctrl-C to arrive: put
# Python's own handler back (children then start with the default action, as from a terminal).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(scope="session")
def tiny_expert(tmp_path_factory):
    """A PPO expert trained for one rollout through the real CLI (it drives badly, but it is a real file)."""
    from agent.cli import main

    out = tmp_path_factory.mktemp("expert") / "expert.zip"
    rc = main(["expert", "train", "--ppo.timesteps", "256", "--envs", "2", "--out", str(out), "--tensorboard", "",
               "--device", "cpu", "--run-dir", str(out.parent / "run")])
    assert rc == 0 and out.is_file()
    return out
