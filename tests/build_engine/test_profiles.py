"""GPU profiles: the built-in files load, validation is strict, and the CLI lists/shows them."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from trtforge.build_engine.core.errors import ProfileError
from trtforge.profiles.loader import Profile, list_profiles, load_profile, profile_to_dict
from trtforge_testing import assert_one_line_error


def _builtin_text(name: str) -> str:
    return Path(load_profile(name).source).read_text()


def _write(tmp_path: Path, text: str, name: str = "custom.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtin_profiles_load() -> None:
    names = list_profiles()
    assert {"a10", "a100", "h100"} <= set(names)
    loaded = {n: load_profile(n) for n in names}
    a10, a100, h100 = loaded["a10"], loaded["a100"], loaded["h100"]
    assert (a10.hardware.compute_capability, a10.precision.dtype, a10.hardware.fp8_tflops) == ("8.6", "fp16", None)
    assert (a100.hardware.compute_capability, a100.precision.dtype, a100.precision.allow_fp8) == ("8.0", "bf16", False)
    assert (h100.hardware.compute_capability, h100.precision.dtype, h100.precision.allow_fp8) == ("9.0", "bf16", True)
    assert h100.hardware.fp8_tflops == pytest.approx(2 * h100.hardware.bf16_tflops, rel=0.01)
    for p in loaded.values():
        assert p.name in p.source and Path(p.source).is_file()
        assert p.shapes and all(s.batch.min <= s.batch.opt <= s.batch.max for s in p.shapes)
        assert 0 < p.kv.memory_fraction <= 1
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.name = "x"  # type: ignore[misc]
    # Each hardware number in the file carries a source comment (datasheet / whitepaper / programming guide).
    text = _builtin_text("a100")
    assert "datasheet" in text and "whitepaper" in text


def test_custom_path_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _builtin_text("a10").replace('name = "a10"', 'name = "my-a10"').replace("max = 512", "max = 256")
    p = load_profile(str(_write(tmp_path, text)))
    assert isinstance(p, Profile) and p.name == "my-a10"
    assert p.shapes[1].sequence.max == 256
    # Without a name, the file stem names the profile.
    text2 = "\n".join(ln for ln in text.splitlines() if not ln.startswith("name = \"my-a10\""))
    assert load_profile(str(_write(tmp_path, text2, "edge.toml"))).name == "edge"
    # An existing file given by a bare relative name (no slash, no .toml) is still read as a path.
    _write(tmp_path, text2, "edge2.conf")
    monkeypatch.chdir(tmp_path)
    assert load_profile("edge2.conf").name == "edge2"


@pytest.mark.parametrize(("old", "new", "needles"), [
    ("memory_bandwidth_gbs =", "memory_bandwith_gbs =",
     ["hardware.memory_bandwith_gbs", "hardware.memory_bandwidth_gbs"]),
    ("[kv]", "[kvcache]", ["kvcache", "'kv'"]),
    ("tokens_per_block =", "token_per_block =", ["kv.token_per_block", "kv.tokens_per_block"]),
    ("sequence = {", "seqence = {", ["seqence", "shapes[0].sequence"]),
    ("min = 1, opt = 4", "mn = 1, opt = 4", ["mn", "min"]),
])
def test_unknown_key_names_nearest(tmp_path: Path, cli, old: str, new: str, needles: list[str]) -> None:
    text = _builtin_text("a10")
    assert old in text
    path = _write(tmp_path, text.replace(old, new, 1))
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    msg = str(err.value)
    assert str(path) in msg and "unknown key" in msg
    for n in needles:
        assert n in msg, (n, msg)
    assert_one_line_error(cli("profiles", path), 2, str(path), needles[-1])


@pytest.mark.parametrize(("old", "new", "needles"), [
    ("memory_gb = 24.0", 'memory_gb = "24"', ["hardware.memory_gb", "number"]),
    ("memory_gb = 24.0", "memory_gb = -24.0", ["hardware.memory_gb", "-24", "> 0"]),
    ("sm_count = 72", "sm_count = 7.5", ["hardware.sm_count", "integer"]),
    ('dtype = "fp16"', 'dtype = "fp32"', ["precision.dtype", "fp32", "fp16, bf16"]),
    ("allow_fp8 = false", "allow_fp8 = true", ["precision.allow_fp8", "fp8"]),
    ("allow_fp8 = false", "allow_fp8 = 1", ["precision.allow_fp8", "true or false"]),
    ("memory_fraction = 0.9", "memory_fraction = 1.5", ["kv.memory_fraction", "1.5", "(0, 1]"]),
    ("memory_fraction = 0.9", "memory_fraction = 0", ["kv.memory_fraction", "(0, 1]"]),
    ("optimization_level = 3", "optimization_level = 7", ["builder.optimization_level", "7", "between 0 and 5"]),
    ("aux_streams = 0", "aux_streams = -1", ["builder.aux_streams", "-1", "between 0 and 2147483647"]),
    ("min = 1, opt = 4, max = 8", "min = 1, opt = 16, max = 8", ["shapes[0].batch", "opt=16", "min <= opt <= max"]),
    ('compute_capability = "8.6"', "compute_capability = 8.6", ["hardware.compute_capability", "string"]),
    ("tile = 32", "tile = 48", ["lora.tile", "48", "32, 64, 128, 256"]),
    # held out: values the schema took as powers of two, which lora inject --tile and TensorRT-LLM refuse
    ("tile = 32", "tile = 1", ["lora.tile", "value 1", "32, 64, 128, 256"]),
    ("tile = 32", "tile = 4096", ["lora.tile", "value 4096", "32, 64, 128, 256"]),
    ("tokens_per_block = 32", "tokens_per_block = 48", ["kv.tokens_per_block", "48", "power of two"]),
    ("sm_count = 72", "sm_count = 72\nfp8_tflops = 250.0", ["hardware.fp8_tflops", "8.6"]),
    ('name = "decode"', 'name = "prefill"', ["shapes[1].name", "duplicate"]),
])
def test_bad_value(tmp_path: Path, cli, old: str, new: str, needles: list[str]) -> None:
    text = _builtin_text("a10")
    assert old in text
    path = _write(tmp_path, text.replace(old, new, 1))
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    for n in needles:
        assert n in str(err.value), (n, str(err.value))
    assert_one_line_error(cli("profiles", path), 2, *needles)


def test_missing_key_and_bad_toml(tmp_path: Path) -> None:
    text = _builtin_text("a100")
    no_sm = "\n".join(ln for ln in text.splitlines() if not ln.startswith("sm_count"))
    with pytest.raises(ProfileError, match=r"hardware\.sm_count: missing required key"):
        load_profile(str(_write(tmp_path, no_sm)))
    with pytest.raises(ProfileError, match="invalid TOML"):
        load_profile(str(_write(tmp_path, text + "\n[kv\n", "broken.toml")))


def test_unknown_name_and_missing_file(tmp_path: Path, cli) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile("a1000")
    assert "a1000" in str(err.value) and "did you mean 'a100'" in str(err.value)
    assert all(n in str(err.value) for n in list_profiles())
    assert_one_line_error(cli("profiles", "h10"), 2, "h10", "h100", "a10")
    missing = tmp_path / "nope.toml"
    assert_one_line_error(cli("profiles", missing), 2, str(missing), "not found")


def test_cli_list_show_json(cli) -> None:
    res = cli("profiles")
    assert res.code == 0, res.err
    for name, cc, bw in (("a10", "8.6", "600 GB/s"), ("a100", "8.0", "2039 GB/s"), ("h100", "9.0", "3350 GB/s")):
        line = next(ln for ln in res.out.splitlines() if f" {name} " in ln)
        assert cc in line and bw in line
    res = cli("profiles", "a100")
    assert res.code == 0, res.err
    for needle in ("hardware.sm_count", "108", "bf16", "shapes.prefill.sequence", "kv.tokens_per_block"):
        assert needle in res.out
    res = cli("profiles", "h100", "--json")
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert data == profile_to_dict(load_profile("h100"))
    assert data["precision"] == {"dtype": "bf16", "allow_fp8": True}
    assert data["shapes"][0]["batch"].keys() == {"min", "opt", "max"}
    res = cli("profiles", "--json")
    assert [d["name"] for d in json.loads(res.out)] == list_profiles()


# ------------------------------------------------------------------------------------ the schema is the dataclasses
def _tables() -> dict[str, type]:
    """Dotted table path in the TOML -> its dataclass ("" is the top level; shapes[0] is a [[shapes]] table)."""
    from trtforge.profiles.schema import (
        BuilderSettings,
        Hardware,
        KVSettings,
        LoraSettings,
        Precision,
        Range,
        ShapeProfile,
    )

    return {"": Profile, "hardware": Hardware, "precision": Precision, "builder": BuilderSettings,
            "shapes[0]": ShapeProfile, "shapes[0].batch": Range, "kv": KVSettings, "lora": LoraSettings}


def _h100_data() -> dict:
    import tomllib

    return tomllib.loads(_builtin_text("h100"))


def _table_of(data: dict, path: str) -> dict:
    for part in filter(None, path.split(".")):
        data = data["shapes"][0] if part == "shapes[0]" else data[part]
    return data


@pytest.mark.parametrize("path", list(_tables()))
def test_accepted_toml_keys_are_the_dataclass_fields(path: str) -> None:
    """The keys a table accepts (listed in the unknown-key error) are exactly its dataclass's fields, and the
    built-in h100 file (which sets every optional key too) uses each of them."""
    from trtforge.profiles.loader import parse_profile

    cls = _tables()[path]
    expected = [f.name for f in dataclasses.fields(cls) if f.name != "source"]
    data = _h100_data()
    assert sorted(_table_of(data, path)) == sorted(expected)
    _table_of(data, path)["zzzzzzzzzz"] = 1
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "x.toml", "x")
    prefix = f"{path}." if path else ""
    listed = str(err.value).split("valid keys: ")[1].split(", ")
    assert listed == [prefix + k for k in expected]


@pytest.mark.parametrize("path", list(_tables()))
def test_each_key_is_required_or_has_its_default(path: str) -> None:
    from trtforge.profiles.loader import parse_profile, toml_keys

    cls = _tables()[path]
    prefix = f"{path}." if path else ""
    for key, required in toml_keys(cls).items():
        data = _h100_data()
        del _table_of(data, path)[key]
        if key == "fp8_tflops":
            data["precision"]["allow_fp8"] = False  # fp8 needs the fp8 rate (a rule between keys)
        if required:
            with pytest.raises(ProfileError, match=rf"{re.escape(prefix + key)}: missing required key"):
                parse_profile(data, "x.toml", "x")
        else:
            parse_profile(data, "x.toml", "x")  # optional: the default is used


def test_cli_rows_and_json_follow_the_fields() -> None:
    from trtforge.profiles.loader import profile_rows

    p = load_profile("h100")
    keys = [k for k, _ in profile_rows(p)]
    flat = ["source"] + [f"{t}.{f.name}" for t in ("hardware", "precision", "builder", "kv", "lora")
                         for f in dataclasses.fields(getattr(p, t))]
    assert [k for k in keys if not k.startswith("shapes.")] == flat
    assert [k for k in keys if k.startswith("shapes.")] == [f"shapes.{s.name}.{a}" for s in p.shapes
                                                             for a in ("batch", "sequence")]
    assert set(profile_to_dict(p)) == {f.name for f in dataclasses.fields(Profile)}


def test_lora_tiles_are_the_plugins() -> None:
    """A profile's [lora] tile is what ``trtforge lora inject --tile`` takes for that GPU: the same choices."""
    from trtforge.plugins.lora.spec import TILE_CHOICES
    from trtforge.profiles.schema import LORA_TILES

    assert LORA_TILES == TILE_CHOICES
    for name in ("a10", "a100", "h100", "l40s"):
        assert load_profile(name).lora.tile in TILE_CHOICES


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("sm_count", "1" + "0" * 400, "between 1 and 2147483647"),  # builder: a pybind TypeError (exit 3)
    ("sm_count", "2147483648", "between 1 and 2147483647"),
    ("aux_streams", "2147483648", "between 0 and 2147483647"),  # config.max_aux_streams: TypeError (exit 3)
    ("memory_gb", "1" + "0" * 400, "at most 1e300"),  # float(): OverflowError (exit 3)
    ("memory_gb", "1" + "0" * 5000, "integer too long to read"),  # tomllib: int() digit limit (exit 3)
])
def test_huge_numbers_are_exit_2(tmp_path: Path, cli, key: str, value: str, needle: str) -> None:
    text = _builtin_text("a100")
    assert re.search(rf"^{key} = \S+", text, re.M), key
    path = _write(tmp_path, re.sub(rf"^{key} = \S+", f"{key} = {value}", text, count=1, flags=re.M))
    with pytest.raises(ProfileError, match=re.escape(needle)):
        load_profile(str(path))
    res = cli("kv-plan", "--profile", path, "--model", "llama-3.1-8b")
    assert_one_line_error(res, 2, str(path), needle)
    assert len(res.err) < 400, res.err
