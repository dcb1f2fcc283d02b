"""Loading an expert .zip never runs code from it (no unpickling), and bad files give clear errors."""

import base64
import json
import pathlib
import pickle
import zipfile

import numpy as np
import pytest

from agent.actors.loading import load_policy
from agent.experts.policy import ExpertPolicy
from envs.carracing import PRIVILEGED_DIM, make_carracing

SHIPPED = pathlib.Path(__file__).resolve().parent.parent / "policies" / "carracing-expert-discrete-margin.zip"


class _Touch:
    """Unpickling this creates ``marker``: a stand-in for any command a crafted file could run."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _serialized(marker: pathlib.Path) -> dict:
    """A ``data`` JSON entry as stable-baselines3 writes one for a non-JSON object (base64 of a pickle)."""
    return {":type:": "<class 'stable_baselines3.common.utils.FloatSchedule'>",
            ":serialized:": base64.b64encode(pickle.dumps(_Touch(marker))).decode()}


def _rewrite(src: pathlib.Path, dst: pathlib.Path, data=None, drop=(), replace=None) -> pathlib.Path:
    """Copy the zip ``src`` to ``dst`` with its ``data`` JSON replaced, entries dropped or replaced."""
    replace = replace or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            if name in drop:
                continue
            if name in replace:
                zout.writestr(name, replace[name])
            elif name == "data" and data is not None:
                zout.writestr(name, json.dumps(data))
            else:
                zout.writestr(name, zin.read(name))
    return dst


def _shipped_data() -> dict:
    with zipfile.ZipFile(SHIPPED) as z:
        return json.loads(z.read("data"))


def test_the_payload_is_live(tmp_path):
    """The crafted entry really runs code when unpickled, so the tests below would catch a loader that does."""
    marker = tmp_path / "ran"
    pickle.loads(base64.b64decode(_serialized(marker)[":serialized:"]))
    assert marker.exists()


@pytest.mark.parametrize("loader", [ExpertPolicy.load, load_policy], ids=["ExpertPolicy.load", "load_policy"])
def test_serialized_learning_rate_is_not_unpickled(tmp_path, loader):
    marker = tmp_path / "ran"
    data = _shipped_data()
    for key in ("learning_rate", "lr_schedule", "clip_range", "_last_obs"):
        data[key] = _serialized(marker)
    path = _rewrite(SHIPPED, tmp_path / "crafted.zip", data)
    expert = loader(path)
    assert not marker.exists()
    # the weights are the shipped expert's: the same actions
    states = np.random.default_rng(0).uniform(-2, 2, (50, PRIVILEGED_DIM)).astype(np.float32)
    np.testing.assert_array_equal(expert.act_on_state(states), ExpertPolicy.load(SHIPPED).act_on_state(states))


@pytest.mark.parametrize("loader", [ExpertPolicy.load, load_policy], ids=["ExpertPolicy.load", "load_policy"])
def test_serialized_policy_kwargs_and_spaces_are_not_unpickled(tmp_path, loader):
    marker = tmp_path / "ran"
    data = _shipped_data()
    for key in ("learning_rate", "policy_kwargs", "observation_space", "action_space", "policy_class"):
        data[key] = _serialized(marker)
    path = _rewrite(SHIPPED, tmp_path / "crafted.zip", data)
    # without readable policy_kwargs the loader assumes SB3's default net_arch, which the 256-256 weights do not fit
    with pytest.raises(ValueError, match="crafted.zip.*agent expert train"):
        loader(path)
    assert not marker.exists()


def test_pickled_weights_are_refused(tmp_path):
    import io

    import torch

    marker = tmp_path / "ran"
    buf = io.BytesIO()
    torch.save({"mlp_extractor.policy_net.0.weight": _Touch(marker)}, buf)
    path = _rewrite(SHIPPED, tmp_path / "crafted.zip", replace={"policy.pth": buf.getvalue()})
    with pytest.raises(ValueError, match="policy.pth"):
        ExpertPolicy.load(path)
    assert not marker.exists()


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="agent expert train"):
        ExpertPolicy.load(tmp_path / "missing.zip")
    corrupt = tmp_path / "corrupt.zip"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip" + bytes(range(256)))
    with pytest.raises(ValueError, match="corrupt.zip.*not a readable zip"):
        ExpertPolicy.load(corrupt)
    with pytest.raises(ValueError, match="corrupt.zip"):
        load_policy(corrupt)
    with pytest.raises(ValueError, match="no 'policy.pth'"):
        ExpertPolicy.load(_rewrite(SHIPPED, tmp_path / "noweights.zip", drop=("policy.pth",)))
    with pytest.raises(ValueError, match="no 'data'"):
        ExpertPolicy.load(_rewrite(SHIPPED, tmp_path / "nodata.zip", drop=("data",)))
    with pytest.raises(ValueError, match="not JSON"):
        ExpertPolicy.load(_rewrite(SHIPPED, tmp_path / "badjson.zip", replace={"data": b"\x80\x04not json"}))
    data = _shipped_data()
    data["observation_space"]["_shape"] = [96, 96, 3]
    with pytest.raises(ValueError, match=r"shape \(96, 96, 3\).*agent expert train"):
        ExpertPolicy.load(_rewrite(SHIPPED, tmp_path / "pixels.zip", data))
    data = _shipped_data()
    data["policy_kwargs"] = {"net_arch": [64, 64]}
    with pytest.raises(ValueError, match="weights do not fit"):
        ExpertPolicy.load(_rewrite(SHIPPED, tmp_path / "arch.zip", data))


def test_shipped_expert_loads_and_acts():
    expert = load_policy("carracing-expert-discrete-margin.zip")
    assert isinstance(expert, ExpertPolicy)
    env = make_carracing(render_pixels=False)
    try:
        env.reset(seed=0)
        action = expert.act(env)
    finally:
        env.close()
    assert isinstance(action, int) and 0 <= action <= 4
    actions, state = expert.predict(np.zeros((3, PRIVILEGED_DIM), np.float32))
    assert actions.shape == (3,) and state is None
