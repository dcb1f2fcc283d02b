"""agent average-policies: the weight average of policies of one configuration (a model soup)."""

import numpy as np
import pytest
import torch

from agent.cli import main
from agent.nn.policy import DrivingPolicy, default_config
from agent.train.soup import average_policies, average_state_dicts


def _policy(seed: int, **over) -> DrivingPolicy:
    """A small policy; seeds other than 0 shift every float weight by noise (the build itself is seeded)."""
    policy = DrivingPolicy(default_config("carracing", window=2, **over)).eval()
    if seed:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
    return policy


def test_average_state_dicts_means_floats_and_keeps_equal_integers():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([3])}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor([3])}
    out = average_state_dicts([a, b])
    assert out["w"].tolist() == [2.0, 4.0] and out["n"].tolist() == [3]
    assert average_state_dicts([a, b], [3, 1])["w"].tolist() == [1.5, 3.0]
    with pytest.raises(ValueError, match="differs between"):
        average_state_dicts([a, {"w": b["w"], "n": torch.tensor([4])}])
    with pytest.raises(ValueError, match="two or more"):
        average_state_dicts([a])
    with pytest.raises(ValueError, match="other weights"):
        average_state_dicts([a, {"w": b["w"]}])
    with pytest.raises(ValueError, match="non-negative"):
        average_state_dicts([a, b], [1, -1])


def test_averaging_a_policy_with_itself_changes_nothing_and_two_give_the_mean(tmp_path):
    p0, p1 = _policy(0), _policy(1)
    f0, f1 = p0.save(tmp_path / "a.pt"), p1.save(tmp_path / "b.pt")
    same = average_policies([f0, f0])
    x = torch.randint(0, 255, (1, 2, 96, 96, 3), dtype=torch.uint8)
    with torch.no_grad():
        assert torch.allclose(same(x), p0(x), atol=1e-6)
    soup = average_policies([f0, f1])
    for k, v in soup.state_dict().items():
        a, b = p0.state_dict()[k], p1.state_dict()[k]
        expected = ((a.double() + b.double()) / 2).to(a.dtype) if a.is_floating_point() else a
        assert torch.equal(v, expected), k
    assert any(not torch.equal(soup.state_dict()[k], p0.state_dict()[k]) for k in soup.state_dict())


def test_average_policies_cli_writes_a_loadable_policy_and_refuses_mixed_configs(tmp_path, capsys):
    from agent.actors.loading import load_policy

    f0, f1 = _policy(0).save(tmp_path / "a.pt"), _policy(1).save(tmp_path / "b.pt")
    other = _policy(2, core="gru").save(tmp_path / "gru.pt")
    out = tmp_path / "soup.pt"
    assert main(["average-policies", str(f0), str(f1), "--out", str(out)]) == 0
    soup = load_policy(out)
    assert isinstance(soup, DrivingPolicy)
    action, _ = soup.predict(np.zeros((96, 96, 3), np.uint8))
    assert 0 <= int(action) < 5
    capsys.readouterr()
    assert main(["average-policies", str(f0), str(f1), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["average-policies", str(f0), str(other), "--out", str(tmp_path / "x.pt")]) == 2
    assert "configuration" in capsys.readouterr().err
    assert main(["average-policies", str(f0), "--out", str(tmp_path / "y.pt")]) == 2
    assert "two or more policy files" in capsys.readouterr().err
    assert main(["average-policies", str(f0), str(f1), "--weights", "1", "--out", str(tmp_path / "y.pt")]) == 2
    assert "one weight per policy" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists() and not (tmp_path / "y.pt").exists()
