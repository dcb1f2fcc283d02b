import numpy as np
import pytest
import torch

from agent.nn.policy import CNNFeatures, NACPolicy, PolicyConfig


@pytest.fixture
def policy():
    torch.manual_seed(0)
    return NACPolicy(PolicyConfig(window=6)).eval()


def test_cnn_flatten_size_from_dry_run():
    import gymnasium as gym

    cnn = CNNFeatures(gym.spaces.Box(0, 255, (96, 96, 3), np.uint8))
    assert cnn.features_dim == 30 * 9 * 9
    small = CNNFeatures(gym.spaces.Box(0, 255, (64, 80, 3), np.uint8))
    assert small(torch.zeros(2, 64, 80, 3, dtype=torch.uint8)).shape == (2, small.features_dim)
    with pytest.raises(ValueError, match="too small"):
        CNNFeatures(gym.spaces.Box(0, 255, (8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"\(H, W, C\)"):
        CNNFeatures(gym.spaces.Box(0, 1, (10,), np.float32))


def test_forward_shapes(policy):
    obs = torch.randint(0, 255, (2, 6, 96, 96, 3), dtype=torch.uint8)
    logits, inter = policy(obs, return_intermediates=True)
    assert logits.shape == (2, 6, 5)
    assert inter.phi.shape == (2, 16, 6, 6)  # K = min(8, T)


def test_streaming_equals_window(policy):
    obs = torch.randint(0, 255, (1, 10, 96, 96, 3), dtype=torch.uint8)
    state, outs = None, []
    for i in range(10):
        logits, state = policy.step(obs[:, i], state)
        outs.append(logits)
    with torch.no_grad():
        ref = policy(obs[:, 4:10])[:, -1]  # the last window of 6 frames
        ref0 = policy(obs[:, :6])
    assert torch.allclose(outs[-1], ref, atol=1e-5)
    assert torch.allclose(torch.stack(outs[:6], 1), ref0, atol=1e-5)
    assert state.cache.length == 6


def test_predict_single_and_batch_and_episode_start(policy):
    frame = np.random.randint(0, 255, (96, 96, 3), np.uint8)
    a, st = policy.predict(frame)
    assert isinstance(a, int) and 0 <= a < 5 and st.steps == 1
    a, st = policy.predict(frame, st)
    assert st.steps == 2
    a, st = policy.predict(frame, st, episode_start=np.array([True]))
    assert st.steps == 1  # window restarted
    acts, st = policy.predict(np.stack([frame, frame]))
    assert acts.shape == (2,)
    with pytest.raises(ValueError, match="96, 96, 3"):
        policy.predict(np.zeros((64, 64, 3), np.uint8))


def test_save_load_same_actions(policy, tmp_path):
    path = policy.save(tmp_path / "p.pt", metadata={"note": "test"})
    loaded = NACPolicy.load(path)
    assert loaded.config == policy.config and loaded.metadata == {"note": "test"}
    frames = np.random.randint(0, 255, (8, 96, 96, 3), np.uint8)
    s1 = s2 = None
    for f in frames:
        l1, s1 = policy.step(torch.as_tensor(f[None]), s1)
        l2, s2 = loaded.step(torch.as_tensor(f[None]), s2)
        assert torch.allclose(l1, l2)


def test_bad_policy_files_give_clear_errors(policy, tmp_path):
    with pytest.raises(FileNotFoundError):
        NACPolicy.load(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file at all")
    with pytest.raises(ValueError, match="not a readable policy file"):
        NACPolicy.load(junk)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    with pytest.raises(ValueError, match="not a NAC policy file"):
        NACPolicy.load(other)
    good = policy.save(tmp_path / "good.pt")
    payload = torch.load(good, weights_only=True)
    payload["format_version"] = 99
    torch.save(payload, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="format version 99"):
        NACPolicy.load(tmp_path / "future.pt")
    payload["format_version"] = 1
    payload["config"]["d_model"] = 32
    torch.save(payload, tmp_path / "mismatch.pt")
    with pytest.raises(ValueError, match="do not fit"):
        NACPolicy.load(tmp_path / "mismatch.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(ValueError):
        NACPolicy.load(truncated)
