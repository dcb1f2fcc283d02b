"""agent.drive.faithfulness: ROAD on a model whose answer is known, cascading randomisation, baselines."""

import numpy as np
import pytest
import torch
from torch import nn

from agent.drive import faithfulness as F


class RegionNet(nn.Module):
    """(N, 3, 32, 32) -> (N, 2): logit 0 is the texture energy of the top-left 16 x 16 pixels, logit 1 is 0.

    Only that region matters, so a map marking it is the faithful answer.
    """

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=g))
            self.conv.bias.zero_()

    def forward(self, x):
        energy = (self.conv(x) ** 2)[:, :, :16, :16].mean(dim=(1, 2, 3))
        return torch.stack([energy, torch.zeros_like(energy)], dim=1)


def _noise_image(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand((1, 3, 32, 32), generator=g)


def test_road_prefers_the_pixels_the_model_uses_over_random_cam():
    F.ensure_torchvision()
    lib = pytest.importorskip("pytorch_grad_cam")
    model, x = RegionNet().eval(), _noise_image()
    truth = np.zeros((32, 32), np.float32)
    truth[:16, :16] = 1.0
    scores_true = F.faithfulness_scores(model, x, truth, 0, seed=3, target="logit")
    road_random = []
    for s in range(3):
        with F.seeded(s), lib.RandomCAM(model=model, target_layers=[model.conv]) as cam:
            rand = cam(input_tensor=x, targets=[F._cam_target(0)])[0]
        road_random.append(F.faithfulness_scores(model, x, rand, 0, seed=3, target="logit")["road"])
    with torch.no_grad():
        score = float(model(x)[0, 0])
    # removing the used region first drops the score; removing the rest first keeps it (up to the
    # 3x3 convolution's reach across the region's border)
    assert scores_true["morf"][20] < -0.5 * score
    assert abs(scores_true["lerf"][80]) < 0.02 * score
    assert scores_true["road"] > max(road_random) and scores_true["road"] > 0.1 * score


def test_faithfulness_scores_checks_shapes_and_target():
    model, x = RegionNet().eval(), _noise_image()
    with pytest.raises(ValueError, match="cam must be"):
        F.faithfulness_scores(model, x, np.zeros((16, 16)), 0)
    with pytest.raises(ValueError, match="one \\(1, C, H, W\\)"):
        F.faithfulness_scores(model, x.expand(2, -1, -1, -1), np.zeros((32, 32)), 0)
    with pytest.raises(ValueError, match="target must be"):
        F.faithfulness_scores(model, x, np.zeros((32, 32)), 0, target="probability")


def test_logit_margin_target():
    t = F.LogitMarginTarget(1)
    assert float(t(torch.tensor([1.0, 5.0, 3.0]))) == pytest.approx(2.0)
    assert float(t(torch.tensor([[9.0, 5.0, 3.0]]))) == pytest.approx(-4.0)


def test_road_mask_marks_grey_road_not_grass_kerb_or_dashboard():
    f = np.zeros((96, 96, 3), np.uint8)
    f[:, :] = (102, 204, 102)  # grass
    f[10:40, 20:60] = (102, 102, 102)  # road
    f[40:50, 20:60] = (107, 107, 107)  # road, another tile shade
    f[50:52, 20:60] = (255, 0, 0)  # kerb
    f[84:] = 0  # dashboard strip
    m = F.road_mask(f)
    assert m.dtype == np.float32 and m.shape == (96, 96)
    assert m[10:50, 20:60].min() == 1.0
    assert m.sum() == 40 * 40
    with pytest.raises(ValueError):
        F.road_mask(f[..., 0])


def test_ssim_and_rank_correlation():
    rng = np.random.default_rng(0)
    a = rng.random((24, 24))
    assert F.ssim(a, a) == pytest.approx(1.0)
    assert F.ssim(a, rng.random((24, 24))) < 0.5
    assert F.rank_correlation(a, 2 * a + 1) == pytest.approx(1.0)
    assert F.rank_correlation(a, -a) == pytest.approx(-1.0)
    assert np.isnan(F.rank_correlation(a, np.zeros_like(a)))
    with pytest.raises(ValueError):
        F.ssim(a, a[:10])


def _tiny_policy_and_samples(n=4, seed=0):
    """A randomly initialised policy from the project's constructors and n synthetic road-like frames."""
    from agent.nn.policy import DrivingPolicy, default_config

    policy = DrivingPolicy(default_config("carracing", window=2)).eval()
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        frames = np.empty((3, 96, 96, 3), np.uint8)
        frames[:] = (102, 204, 102)
        for j in range(3):  # a grey band that moves, plus texture
            c = 30 + 8 * i + 2 * j
            frames[j, :84, c:c + 24] = (102, 102, 102)
            frames[j] = np.clip(frames[j].astype(int) + rng.integers(-20, 20, (96, 96, 3)), 0, 255)
            frames[j, 84:] = 0
        hist, frame = frames[:2], frames[2]
        state = F.stream_state(policy, hist)
        with torch.no_grad():
            y, _ = policy.step(torch.as_tensor(frame)[None], state)
        samples.append(F.Sample(frame, state, None, int(y.argmax()), 0, i, hist))
    return policy, samples


def test_method_maps_shapes_and_unreadable_pixels():
    policy, samples = _tiny_policy_and_samples(2)
    layers = F.conv_layers(policy)
    assert list(layers) == ["conv1", "conv2", "conv3"]
    keep = F.input_keep_mask(policy, (96, 96))
    flags = {n: p.requires_grad for n, p in policy.named_parameters()}
    for m in ("GradCAM", "RandomCAM", "SobelCAM", "road"):
        run = F.method_maps(policy, samples, m, layers["conv3"])
        assert run.error is None, run.error
        assert len(run.maps) == 2 and len(run.seconds) == 2
        for c in run.maps:
            assert c.shape == keep.shape and c.min() >= 0 and c.max() <= 1
            assert not c[keep == 0].any()  # the blanked dashboard strip carries no heat
    assert {n: p.requires_grad for n, p in policy.named_parameters()} == flags
    assert F.method_maps(policy, samples, "NoSuchCAM", layers["conv3"]).error


def test_cascading_randomisation_changes_gradcam_and_flags_sobel():
    policy, samples = _tiny_policy_and_samples(4)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    groups = [g for g, _ in F.randomisation_groups(policy)]
    assert groups[:2] == ["head", "core"] and groups[-3:] == ["conv3", "conv2", "conv1"]
    res = F.sanity_check(policy, samples, ["GradCAM", "SobelCAM"], "conv3", seed=0)
    # the trained policy is untouched (the randomisation works on deep copies)
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    grad = res["GradCAM"]
    assert grad["error"] is None and len(grad["stages"]) == len(groups)
    rhos = [s["spearman"]["mean"] for s in grad["stages"]]
    assert min(rhos) < 0.5, rhos
    assert grad["passes"] is True
    sob = res["SobelCAM"]
    assert all(s["spearman"]["mean"] == pytest.approx(1.0) for s in sob["stages"])
    assert sob["passes"] is False
    table = F.sanity_markdown({"sanity": {"conv3": res}, "sanity_steps": 4})
    assert [ln for ln in table.splitlines() if ln.startswith("| SobelCAM")][0].endswith("| fails |")
    assert [ln for ln in table.splitlines() if ln.startswith("| GradCAM")][0].endswith("| passes |")


def test_cascade_copies_randomise_cumulatively():
    policy, _ = _tiny_policy_and_samples(1)
    groups = F.randomisation_groups(policy)
    trained = {n: p.detach().clone() for n, p in policy.named_parameters()}
    seen = []
    for k, (gname, cp) in enumerate(F.cascade_copies(policy, seed=1)):
        assert gname == groups[k][0]
        params = dict(cp.named_parameters())
        changed = {n for n, p in params.items() if not torch.equal(p, trained[n]) and p.numel() > 1}
        expect = {n for _, names in groups[: k + 1] for n in names if trained[n].numel() > 1 and trained[n].std() > 0}
        assert expect <= changed and changed <= {n for _, names in groups[: k + 1] for n in names}
        seen.append(gname)
    assert seen == [g for g, _ in groups]


def test_a_cut_short_report_resumes_with_its_finished_rows(tmp_path):
    """The rows a run finished are kept in faithfulness.partial.json; a rerun with the same policy, steps
    and settings scores only the rest, and one with other settings starts over."""
    import json

    policy, samples = _tiny_policy_and_samples(3)
    path = policy.save(tmp_path / "tiny.pt")
    out = tmp_path / "out"
    said = []
    kw = dict(methods=["HiResCAM", "GradCAM"], layers=["conv3"], out_dir=out, samples=samples, sanity_steps=0,
              progress=said.append)
    full = F.faithfulness_report(path, [0], 3, **kw)
    assert not (out / "faithfulness.partial.json").exists()
    assert full["reference"] == "GradCAM @ conv3"
    ref = next(r for r in full["rows"] if r["method"] == "GradCAM")
    assert ref["road_minus_reference"]["mean"] == pytest.approx(0.0)
    key = {"weights_sha256": full["weights_sha256"], "tracks": [0], "steps": 3, "percentiles": full["percentiles"],
           "seed": 0}
    # a run cut short after its first row: that row (tampered with, to tell it from a recomputed one) is kept
    first = dict(full["rows"][0], ms_per_frame=-1.0)
    (out / "faithfulness.partial.json").write_text(json.dumps({"key": key, "rows": [first]}))
    said.clear()
    again = F.faithfulness_report(path, [0], 3, **kw)
    assert any("resuming: 1 row(s)" in s and "partial" in s for s in said)
    # and the finished report's other row with it: nothing is scored again
    assert any("resuming: 1 row(s)" in s and s.endswith("faithfulness.json") for s in said)
    assert not any(s.startswith("GradCAM @") for s in said)
    assert again["rows"][0]["ms_per_frame"] == -1.0 and again["rows"][1]["ms_per_frame"] > 0
    assert again["rows"][1]["road"] == pytest.approx(full["rows"][1]["road"])
    # more steps for a row than the cut-short run scored: that row is scored again
    (out / "faithfulness.partial.json").write_text(json.dumps({"key": key, "rows": [dict(first, steps_index=[0])]}))
    said.clear()
    more = F.faithfulness_report(path, [0], 3, **kw)
    assert more["rows"][0]["ms_per_frame"] > 0 and more["rows"][0]["steps"] == 3
    # a finished report is extended: a rerun with one more method scores only that one
    (out / "faithfulness.partial.json").unlink(missing_ok=True)
    said.clear()
    wider = F.faithfulness_report(path, [0], 3, **dict(kw, methods=["HiResCAM", "GradCAM", "LayerCAM"]))
    assert any("resuming: 2 row(s) kept from" in s and "faithfulness.json" in s for s in said)
    assert [r["method"] for r in wider["rows"]] == ["HiResCAM", "GradCAM", "LayerCAM"]
    assert wider["rows"][0]["road"] == more["rows"][0]["road"]
    # other settings (another seed): nothing is kept
    (out / "faithfulness.partial.json").write_text(json.dumps({"key": key, "rows": [first]}))
    said.clear()
    other = F.faithfulness_report(path, [0], 3, seed=1, **kw)
    assert not any("resuming" in s for s in said) and other["rows"][0]["ms_per_frame"] > 0
