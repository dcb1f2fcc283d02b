"""Bounded input (issue 38, item 4): no zip member or policy config can make the project allocate without bound.

Zip bombs are written small on disk: a member of limit + 1 zero bytes, ZIP_DEFLATED (about 1000x smaller). Where
the real limit is large (64 MiB), the test lowers the module's limit rather than writing that much.
"""

import io
import json
import pathlib
import struct
import zipfile

import pytest
import torch

import agent.experts.policy as expert_mod
import agent.nn.policy as policy_mod
from agent.actors.loading import load_policy
from agent.bounded import MAX_ZIP_MEMBERS, ZipMemberTooLarge, check_zip_sizes, read_zip_member
from agent.experts.policy import MAX_JSON_BYTES, ExpertPolicy
from agent.nn.nac import masks_from_state_dict
from agent.nn.policy import (FILE_KIND, FORMAT_VERSION, MAX_OBS_SIDE, MAX_WINDOW, DrivingPolicy, PolicyConfig,
                             check_config_size, config_size, default_config, read_policy_file)

SHIPPED = pathlib.Path(__file__).resolve().parent.parent / "policies" / "carracing-expert-discrete-margin.zip"


def _copy_zip(src, dst, replace=None, add=None, compression=zipfile.ZIP_STORED) -> pathlib.Path:
    """Copy zip ``src`` to ``dst`` with members replaced ({name: bytes}) or added."""
    replace, add = replace or {}, add or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for name in zin.namelist():
            zout.writestr(name, replace.get(name, zin.read(name)))
        for name, data in add.items():
            zout.writestr(name, data)
    return pathlib.Path(dst)


def _understate(path: pathlib.Path, member: str, declared: int) -> None:
    """Rewrite the zip at ``path`` so that ``member``'s headers (local and central) declare ``declared`` bytes."""
    raw = bytearray(path.read_bytes())
    name = member.encode()
    # (signature, offset of the uncompressed size, of the name length, of the name): APPNOTE.TXT 4.3.7 and 4.3.12
    for sig, size_at, len_at, name_at in ((b"PK\x03\x04", 22, 26, 30), (b"PK\x01\x02", 24, 28, 46)):
        at = raw.find(sig)
        while at >= 0:
            n = struct.unpack_from("<H", raw, at + len_at)[0]
            if raw[at + name_at:at + name_at + n] == name:
                struct.pack_into("<I", raw, at + size_at, declared)
            at = raw.find(sig, at + 4)
    path.write_bytes(bytes(raw))


# ---------------------------------------------------------------------------------------------- zip members


def test_member_above_its_declared_limit_is_refused_before_reading(tmp_path):
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data", bytes(4097))
        zf.writestr("small", b"ok")
    assert path.stat().st_size < 1000  # small on disk
    with zipfile.ZipFile(path) as zf:
        assert read_zip_member(zf, "small", path, 4096) == b"ok"
        with pytest.raises(ZipMemberTooLarge, match=r"bomb\.zip: zip member 'data' would inflate to 4,097 bytes.*"
                                                    r"limit 4,096 bytes"):
            read_zip_member(zf, "data", path, 4096)
        assert read_zip_member(zf, "data", path, 4097) == bytes(4097)


def test_a_header_that_understates_the_size_never_yields_more(tmp_path):
    path = tmp_path / "liar.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data", bytes(100_000))
    _understate(path, "data", 100)
    with zipfile.ZipFile(path) as zf:
        assert zf.getinfo("data").file_size == 100  # the crafted header is what zipfile sees
        with pytest.raises((ZipMemberTooLarge, zipfile.BadZipFile)):  # never 100,000 bytes
            read_zip_member(zf, "data", path, 1000)


def test_too_many_members_are_refused(tmp_path):
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(MAX_ZIP_MEMBERS + 1):
            zf.writestr(f"m{i}", b"")
    with zipfile.ZipFile(path) as zf, pytest.raises(ZipMemberTooLarge, match=f"many.zip holds {MAX_ZIP_MEMBERS + 1}"):
        read_zip_member(zf, "m0", path, 10)


def test_expert_zip_bomb_in_data_is_refused(tmp_path):
    """The issue's case: a `data` member that inflates far beyond any stable-baselines3 JSON (real limit)."""
    path = _copy_zip(SHIPPED, tmp_path / "bomb.zip", replace={"data": bytes(MAX_JSON_BYTES + 1)},
                     compression=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < SHIPPED.stat().st_size + 100_000
    for loader in (ExpertPolicy.load, load_policy):
        with pytest.raises(ValueError, match=rf"bomb\.zip: zip member 'data' would inflate to "
                                             rf"{MAX_JSON_BYTES + 1:,} bytes.*limit {MAX_JSON_BYTES:,}"):
            loader(path)


def test_expert_data_header_that_lies_is_refused(tmp_path):
    path = _copy_zip(SHIPPED, tmp_path / "liar.zip", replace={"data": bytes(MAX_JSON_BYTES * 2)},
                     compression=zipfile.ZIP_DEFLATED)
    _understate(path, "data", 1000)
    with pytest.raises(ValueError, match="liar.zip"):
        ExpertPolicy.load(path)


def test_expert_weights_above_the_limit_are_refused(tmp_path, monkeypatch):
    with zipfile.ZipFile(SHIPPED) as zf:
        weights = zf.read("policy.pth")
    monkeypatch.setattr(expert_mod, "MAX_WEIGHTS_BYTES", len(weights) - 1)
    with pytest.raises(ZipMemberTooLarge, match=rf"zip member 'policy.pth' would inflate to {len(weights):,} bytes"):
        ExpertPolicy.load(SHIPPED)
    monkeypatch.setattr(expert_mod, "MAX_WEIGHTS_BYTES", len(weights))
    ExpertPolicy.load(SHIPPED)  # at the limit: loads


def test_expert_weights_whose_records_inflate_beyond_the_limit_are_refused(tmp_path, monkeypatch):
    """policy.pth is itself a zip (torch.save): its records are checked before torch.load inflates them."""
    monkeypatch.setattr(expert_mod, "MAX_WEIGHTS_BYTES", 1 << 20)
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("archive/data.pkl", b"")
        zf.writestr("archive/data/0", bytes((1 << 20) + 1))
    assert len(inner.getvalue()) < 10_000
    path = _copy_zip(SHIPPED, tmp_path / "inner.zip", replace={"policy.pth": inner.getvalue()})
    with pytest.raises(ZipMemberTooLarge, match=r"inner.zip \(its policy.pth\): its zip members declare "
                                                r"1,048,5\d\d bytes.*'archive/data/0'"):
        ExpertPolicy.load(path)
    raw = _copy_zip(SHIPPED, tmp_path / "raw.zip", replace={"policy.pth": b"\x80\x04not a zip"})
    with pytest.raises(ValueError, match="raw.zip: its policy.pth is not a zip-format torch file"):
        ExpertPolicy.load(raw)


def test_pt_policy_file_records_are_checked_before_torch_load(tmp_path, monkeypatch):
    path = tmp_path / "tiny.pt"
    torch.save({"kind": FILE_KIND, "state_dict": {"w": torch.zeros(1000)}}, path)
    assert read_policy_file(path)["kind"] == FILE_KIND
    monkeypatch.setattr(policy_mod, "MAX_POLICY_FILE_BYTES", 2000)
    with pytest.raises(ValueError, match=r"tiny.pt: its zip members declare [\d,]+ bytes inflated in all "
                                         r"\(limit 2,000 bytes"):
        read_policy_file(path)
    monkeypatch.setattr(policy_mod, "MAX_POLICY_FILE_BYTES", 1 << 20)
    monkeypatch.setattr(policy_mod, "MAX_POLICY_FILE_RECORDS", 2)
    with pytest.raises(ValueError, match=r"tiny.pt holds \d zip members \(limit 2\)"):
        read_policy_file(path)
    legacy = tmp_path / "legacy.pt"
    torch.save({"kind": FILE_KIND}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match="legacy.pt is not a readable policy file.*not a zip-format torch file"):
        read_policy_file(legacy)


def test_check_zip_sizes_on_bytes_and_non_zips(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a", bytes(500))
        zf.writestr("b", bytes(600))
    assert check_zip_sizes(buf.getvalue(), "x", 1100, 2)
    with pytest.raises(ZipMemberTooLarge, match=r"x: its zip members declare 1,100 bytes.*limit 1,099.*'b'"):
        check_zip_sizes(buf.getvalue(), "x", 1099, 2)
    assert check_zip_sizes(b"not a zip", "x", 10, 1) is False


# ---------------------------------------------------------------------------------------------- policy configs


def _crafted_pt(path, **config_overrides) -> pathlib.Path:
    config = default_config("carracing").to_dict()
    config.update(config_overrides)
    torch.save({"kind": FILE_KIND, "format_version": FORMAT_VERSION, "config": config, "state_dict": {},
                "metadata": {}}, path)
    return path


def test_crafted_obs_shape_is_refused_before_building(tmp_path):
    """The issue's case: obs_shape 100000x100000 escaped as a MemoryError from the CNN's dry run."""
    path = _crafted_pt(tmp_path / "huge.pt", obs_shape=[100000, 100000, 3])
    for loader in (DrivingPolicy.load, load_policy):
        with pytest.raises(ValueError, match=rf"huge.pt: its stored policy config is refused: policy config "
                                             rf"obs_shape H 100000 is above the limit of {MAX_OBS_SIDE:,} pixels"):
            loader(path)


@pytest.mark.parametrize("overrides, match", [
    (dict(window=MAX_WINDOW + 1), rf"window {MAX_WINDOW + 1} is above the limit of {MAX_WINDOW}"),
    (dict(obs_shape=(96, 96, 64)), "obs_shape C 64 is above the limit of 4 channels"),
    (dict(d_model=10**6), "d_model 1000000 is above the limit of 4,096"),
    (dict(head_hidden=10**6), "head_hidden 1000000 is above the limit"),
    (dict(core_kwargs={"num_heads": 16, "backbone_units": 10**6}), r"core_kwargs.backbone_units 1000000 is above"),
    (dict(features_kwargs={"channels": [10, 20, 10**6]}), r"features_kwargs.channels \[10, 20, 1000000\] is above"),
    (dict(action_space={"type": "discrete", "n": 10**9}, action_names=["a"] * 3),
     "action_space has 1,000,000,000 actions/outputs, above the limit of 4,096"),
])
def test_config_fields_above_their_limits_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        default_config("carracing", **overrides)


def test_configs_that_would_allocate_too_much_are_refused(tmp_path):
    # every field within its limit, but 4096-channel convolutions: ~1.2 G parameters
    cfg = default_config("carracing", features_kwargs={"channels": (4096, 4096, 4096)})
    with pytest.raises(ValueError, match=r"up to [\d,]+ parameters \(limit 100,000,000.*the features"):
        DrivingPolicy(cfg)
    # few parameters, but a first convolution of 4096 channels over a 1024x1024 frame: ~2 G elements per frame
    cfg = default_config("carracing", obs_shape=(1024, 1024, 3), features_kwargs={"channels": (4096, 1, 1)})
    assert config_size(cfg)["parameters"] < policy_mod.MAX_PARAMETERS
    with pytest.raises(ValueError, match=r"would output [\d,]+ elements per frame \(limit 67,108,864"):
        DrivingPolicy(cfg)
    # a wide core: d_model 4096 over CarRacing's 2430 features
    path = _crafted_pt(tmp_path / "wide.pt", d_model=4096, head_hidden=4096)
    with pytest.raises(ValueError, match=r"wide.pt: its stored policy config is refused.*the core"):
        DrivingPolicy.load(path)
    # a lower limit refuses the default config: the check does use the computed size
    with pytest.raises(ValueError, match="limit 1,000"):
        check_config_size(default_config("carracing"), max_parameters=1000)


@pytest.mark.parametrize("env, core", [("carracing", "nac-steady"), ("carracing", "lstm"), ("carracing", "gru"),
                                       ("carracing", "cfc"), ("carracing", "ltc"), ("carracing", "mha"),
                                       ("carracing", "none"), ("udacity", "nac-exact")])
def test_size_bound_covers_the_built_policy(env, core):
    cfg = default_config(env, core=core)
    with masks_from_state_dict():
        policy = DrivingPolicy(cfg)
    built = sum(p.numel() for p in policy.parameters()) + sum(b.numel() for b in policy.buffers())
    size = config_size(cfg)
    assert built <= size["parameters"] < 20 * built  # an upper bound, within an order of magnitude or so
    assert size["features"] == sum(p.numel() for p in policy.features.parameters()) + \
        sum(b.numel() for b in policy.features.buffers())
    assert 0 < size["frame_activations"] < policy_mod.MAX_FRAME_ACTIVATIONS


def test_config_json_roundtrip_keeps_limits():
    """A config within the limits survives to_dict -> PolicyConfig (what policy files store)."""
    cfg = default_config("udacity")
    again = PolicyConfig(**json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
