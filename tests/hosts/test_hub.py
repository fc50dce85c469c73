"""Hub references (hosts/hub.py): which files a reference means, and huggingface_hub fetching them
for real from a local stand-in of the hub (support/hub.py): the quant asked for, split models,
the projector beside a model, a gated repo and HF_TOKEN, a download cut mid-file and resumed,
the cache reused offline, and the errors that say what to change."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
from support.hub import Hub, Repo

from openai_ext.hosts import hub
from openai_ext.hosts.hub import HubError, Reference, choose, parse


@pytest.mark.parametrize("text, ref", [
    ("bartowski/Qwen2.5-0.5B-Instruct-GGUF", Reference("bartowski/Qwen2.5-0.5B-Instruct-GGUF")),
    ("org/repo:q8_0", Reference("org/repo", quant="q8_0")),
    ("org/repo/sub/file.gguf", Reference("org/repo", file="sub/file.gguf")),
    ("hf.co/org/repo:Q4_K_M", Reference("org/repo", quant="Q4_K_M")),
    ("https://huggingface.co/org/repo", Reference("org/repo")),
    ("/models/x.gguf", None), ("./x.gguf", None), ("~/x.gguf", None), ("models/x.gguf", None), ("x.gguf", None),
    ("C:/models/x.gguf", None), ("just-a-name", None), ("", None),
])
def test_a_reference_is_told_from_a_path(text, ref):
    assert parse(text) == ref


def test_an_existing_file_is_a_path_whatever_its_name(tmp_path, monkeypatch):
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "repo").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    assert parse("org/repo") is None


FILES = ["README.md", "Model-IQ4_XS.gguf", "Model-Q4_K.gguf", "Model-Q4_K_M.gguf", "Model-Q8_0.gguf",
         "mmproj-Model-f16.gguf", "mmproj-Model-Q8_0.gguf"]


def test_the_file_a_reference_means():
    assert choose(Reference("o/r"), FILES) == (["Model-Q4_K_M.gguf"], "mmproj-Model-f16.gguf")
    assert choose(Reference("o/r", quant="q8_0"), FILES)[0] == ["Model-Q8_0.gguf"]
    assert choose(Reference("o/r", quant="Q4_K"), FILES)[0] == ["Model-Q4_K.gguf"]   # not Q4_K_M
    assert choose(Reference("o/r", file="Model-IQ4_XS.gguf"), FILES)[0] == ["Model-IQ4_XS.gguf"]
    assert choose(Reference("o/r"), ["b-Q5_0.gguf", "a-Q6_K.gguf"]) == (["a-Q6_K.gguf"], None)   # no Q4_K_M: first


def test_a_split_model_means_all_its_parts_first_part_first():
    files = ["Q4_K_M/M-Q4_K_M-00002-of-00003.gguf", "Q4_K_M/M-Q4_K_M-00001-of-00003.gguf",
             "Q4_K_M/M-Q4_K_M-00003-of-00003.gguf", "Q8_0/M-Q8_0-00001-of-00002.gguf",
             "Q8_0/M-Q8_0-00002-of-00002.gguf", "Q8_0/mmproj-f16.gguf", "mmproj-f16.gguf"]
    parts, mmproj = choose(Reference("o/r", quant="Q8_0"), files)
    assert parts == ["Q8_0/M-Q8_0-00001-of-00002.gguf", "Q8_0/M-Q8_0-00002-of-00002.gguf"]
    assert mmproj == "Q8_0/mmproj-f16.gguf"   # the projector in the model's own folder
    assert choose(Reference("o/r"), files)[0][0] == "Q4_K_M/M-Q4_K_M-00001-of-00003.gguf"
    with pytest.raises(HubError, match="split in 3 files, and the repo has 2"):
        choose(Reference("o/r"), files[:2])


def test_what_a_repo_lacks_is_told_with_what_it_has():
    with pytest.raises(HubError) as e:
        choose(Reference("o/r", quant="Q5_K_S"), FILES)
    assert "no Q5_K_S file" in str(e.value) and "IQ4_XS, Q4_K, Q4_K_M, Q8_0" in str(e.value)
    with pytest.raises(HubError, match="has no file x.gguf"):
        choose(Reference("o/r", file="x.gguf"), FILES)
    with pytest.raises(HubError, match="no GGUF model file"):
        choose(Reference("o/r"), ["model.safetensors", "config.json"])


# --- against the stand-in hub ------------------------------------------------------------------

@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The stand-in hub, huggingface_hub pointed at it and online, and a cache of this test's own."""
    data = tmp_path / "data"
    data.mkdir()

    def blob(name: str, size: int) -> Path:
        path = data / name
        path.write_bytes(bytes(i % 251 for i in range(size)))
        return path

    model = blob("model.gguf", 25_000_000)   # bigger than huggingface_hub's chunk: a cut keeps bytes
    small = blob("small.gguf", 1000)
    served = Hub({
        "org/Model-GGUF": Repo({"Model-Q4_K_M.gguf": model, "Model-Q8_0.gguf": small,
                                "mmproj-Model-f16.gguf": small, "README.md": small}),
        "org/Split-GGUF": Repo({"S-Q4_K_M-00001-of-00002.gguf": small, "S-Q4_K_M-00002-of-00002.gguf": small}),
        "org/Gated-GGUF": Repo({"G-Q4_K_M.gguf": small}, gated_token="hf_secret"),
    }).start()
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    served.cache = tmp_path / "cache"   # type: ignore[attr-defined]
    served.model = model                # type: ignore[attr-defined]
    yield served
    served.stop()


def test_a_reference_is_fetched_with_its_projector(stand_in):
    got = hub.fetch(parse("org/Model-GGUF"), cache_dir=stand_in.cache)
    assert got.model.name == "Model-Q4_K_M.gguf" and got.model.read_bytes() == stand_in.model.read_bytes()
    assert got.mmproj is not None and got.mmproj.name == "mmproj-Model-f16.gguf"
    assert stand_in.cache in got.model.parents   # the hub's cache, as llama-server and the hub's tools share it
    assert stand_in.fetched("README.md") == []   # nothing else


def test_a_split_model_is_fetched_whole(stand_in):
    got = hub.fetch(parse("org/Split-GGUF"), cache_dir=stand_in.cache)
    assert got.model.name == "S-Q4_K_M-00001-of-00002.gguf"
    assert (got.model.parent / "S-Q4_K_M-00002-of-00002.gguf").is_file()   # beside it, where llama.cpp looks


def test_a_download_cut_midway_resumes_where_it_was(stand_in):
    stand_in.cut_once["org/Model-GGUF/Model-Q4_K_M.gguf"] = 15_000_000
    got = hub.fetch(parse("org/Model-GGUF"), cache_dir=stand_in.cache)
    assert got.model.read_bytes() == stand_in.model.read_bytes()
    ranges = stand_in.fetched("Model-Q4_K_M.gguf")
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")
    assert int(ranges[1].removeprefix("bytes=").rstrip("-")) > 0


def test_the_cache_serves_offline(stand_in, monkeypatch):
    first = hub.fetch(parse("org/Model-GGUF:Q8_0"), cache_dir=stand_in.cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    asked = len(stand_in.requests)
    again = hub.fetch(parse("org/Model-GGUF:Q8_0"), cache_dir=stand_in.cache)
    assert again.model == first.model and len(stand_in.requests) == asked   # the hub was not asked
    with pytest.raises(HubError, match="not in the hub's cache and HF_HUB_OFFLINE is set"):
        hub.fetch(parse("org/Split-GGUF"), cache_dir=stand_in.cache)


def test_the_cache_serves_when_the_hub_is_down(stand_in):
    first = hub.fetch(parse("org/Model-GGUF:Q8_0"), cache_dir=stand_in.cache)
    stand_in.stop()
    assert hub.fetch(parse("org/Model-GGUF:Q8_0"), cache_dir=stand_in.cache).model == first.model


def test_a_gated_repo_needs_the_token(stand_in, monkeypatch):
    with pytest.raises(HubError, match="gated.*HF_TOKEN"):
        hub.fetch(parse("org/Gated-GGUF"), cache_dir=stand_in.cache)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert hub.fetch(parse("org/Gated-GGUF"), cache_dir=stand_in.cache).model.name == "G-Q4_K_M.gguf"


def test_errors_say_what_to_change(stand_in, monkeypatch):
    with pytest.raises(HubError, match="no model org/Nothing-GGUF on the hub"):
        hub.fetch(parse("org/Nothing-GGUF"), cache_dir=stand_in.cache)
    with pytest.raises(HubError, match="no Q6_K file. Quantizations there: Q4_K_M, Q8_0"):
        hub.fetch(parse("org/Model-GGUF:Q6_K"), cache_dir=stand_in.cache)
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(HubError, match=r"needs 0.03 GB and .* has 0.00 GB free"):
        hub.fetch(parse("org/Model-GGUF"), cache_dir=stand_in.cache)
    assert stand_in.fetched("Model-Q4_K_M.gguf") == []   # refused before any byte was fetched


def test_a_path_is_a_path(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert hub.resolve(str(model)).model == model
    with pytest.raises(HubError, match="no model file .*missing.gguf"):
        hub.resolve(str(tmp_path / "missing.gguf"))


def test_a_projector_beside_a_model_is_found_by_its_name(tmp_path):
    for name in ("SmolVLM-256M-Instruct-Q8_0.gguf", "mmproj-SmolVLM-256M-Instruct-f16.gguf", "Other-Q4_K_M.gguf",
                 "Qwen-mmproj.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert hub.projector_beside(tmp_path / "SmolVLM-256M-Instruct-Q8_0.gguf").name == \
        "mmproj-SmolVLM-256M-Instruct-f16.gguf"
    assert hub.projector_beside(tmp_path / "Other-Q4_K_M.gguf") is None   # another model's is not taken
    assert hub.resolve(str(tmp_path / "SmolVLM-256M-Instruct-Q8_0.gguf")).mmproj is not None
