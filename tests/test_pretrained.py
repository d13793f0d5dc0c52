"""create_vit with weights (pretrained=True against a server on 127.0.0.1, weights=PATH), ImageNet-1k class names,
and recognising a model file's form without --from.

The served files are tiny state dicts in torchvision's and timm's layouts, made with our own exporters; the real
tables (URLs, hashes, preprocessing) are checked against torchvision and timm in tests/test_interop_pretrained.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time

import pytest
import torch
from _interop import TINY, perturbed
from _loopback import closed_port_url, serve
from PIL import Image
from safetensors.torch import save as safetensors_save

from vit_einops import ViT, create_vit, load_model, save_vit
from vit_einops.base.download import DownloadError, download
from vit_einops.commands.cli import main
from vit_einops.imagenet import ASSUMED, imagenet1k_classes
from vit_einops.interop import save_state_dict_file, to_timm, to_torchvision
from vit_einops.pretrained import PRETRAINED, PublishedWeights, download_limit
from vit_einops.prediction import predict
from vit_einops.preprocess import Preprocessing
from vit_einops.presets import PRESETS
from vit_einops.sources import detect_source

NAME = "vit_tiny_test"  # a preset of TINY's size, registered by the fixture; 1000 classes, as ImageNet's
TINY_1K = {**TINY, "num_classes": 1000}
PREPROCESSING = Preprocessing.torchvision(32, 36)


@pytest.fixture
def tiny_model():
    return perturbed(ViT(**TINY_1K))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """TORCH_HOME in tmp_path (torch.hub's cache follows it), no proxy between us and 127.0.0.1, and the tiny preset."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "HF_ENDPOINT", "VIT_EINOPS_WEIGHTS_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(PRESETS, NAME, TINY_1K)
    return tmp_path / "torch" / "hub" / "checkpoints"


def _publish(monkeypatch, site, data: bytes, prefix: str | None = None) -> str:
    """Serve ``data`` as NAME's torchvision file, named with ``prefix`` (default: its real sha256 prefix)."""
    prefix = prefix or hashlib.sha256(data).hexdigest()[:8]
    file = f"{NAME}-{prefix}.pth"
    site.files[file] = data
    monkeypatch.setitem(PRETRAINED, NAME, PublishedWeights("torchvision", file, 32, 1000, PREPROCESSING))
    monkeypatch.setenv("VIT_EINOPS_WEIGHTS_URL", site.url)
    return file


def _torchvision_bytes(model: ViT) -> bytes:
    buffer = io.BytesIO()
    torch.save(to_torchvision(model), buffer)
    return buffer.getvalue()


def test_pretrained_downloads_once_converts_and_names_the_classes(tiny_model, cache, monkeypatch):
    with serve() as site:
        file = _publish(monkeypatch, site, _torchvision_bytes(tiny_model))
        model = create_vit(NAME, pretrained=True)
        again = create_vit(NAME, pretrained=True)
    assert site.requests == [("GET", file)]  # the second call read the cache
    assert sorted(p.name for p in cache.iterdir()) == [file]
    for loaded in (model, again):
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in tiny_model.state_dict().items())
    assert model.preprocessing == PREPROCESSING
    assert model.class_names[:3] == ["tench", "goldfish", "great white shark"] and len(model.class_names) == 1000
    assert model.source["url"] == f"{site.url}/{file}" and model.source["pretrained"] == NAME
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(images), tiny_model(images), rtol=0, atol=0)


def test_pretrained_with_num_classes_gets_a_new_head(tiny_model, cache, monkeypatch):
    with serve() as site:
        _publish(monkeypatch, site, _torchvision_bytes(tiny_model))
        model = create_vit(NAME, pretrained=True, num_classes=3)
    assert model.config.num_classes == 3 and model.class_names is None
    assert torch.equal(model.blocks[0].attn.mha.qkv.weight, tiny_model.blocks[0].attn.mha.qkv.weight)


def test_a_download_whose_hash_differs_is_refused_and_not_cached(tiny_model, cache, monkeypatch):
    with serve() as site:
        file = _publish(monkeypatch, site, _torchvision_bytes(tiny_model), prefix="00000000")
        refused = rf"refused {site.url}/{file}: its sha256 .* does not start with 00000000"
        with pytest.raises(DownloadError, match=refused):
            create_vit(NAME, pretrained=True)
    assert list(cache.iterdir()) == []  # neither the file nor a temporary


def test_a_truncated_download_is_refused_and_not_cached(tiny_model, cache, monkeypatch):
    data = _torchvision_bytes(tiny_model)
    with serve() as site:
        file = _publish(monkeypatch, site, data)
        site.truncate.add(file)
        cut = rf"refused {site.url}/{file}: received {len(data) // 2:,} of its {len(data):,} bytes \(cut short\)"
        with pytest.raises(DownloadError, match=cut):
            create_vit(NAME, pretrained=True)
    assert list(cache.iterdir()) == []


def test_offline_is_one_line_naming_the_url_and_the_local_way(cache, monkeypatch):
    monkeypatch.setenv("VIT_EINOPS_WEIGHTS_URL", url := closed_port_url())
    with pytest.raises(DownloadError) as caught:
        create_vit("vit_b_16", pretrained=True)
    message = str(caught.value)
    assert message.startswith(f"create_vit('vit_b_16', pretrained=True) could not fetch {url}/vit_b_16-c867db91.pth: ")
    assert "refused" in message.lower()  # the connection's own reason
    assert "create_vit('vit_b_16', weights='vit_b_16-c867db91.pth')" in message
    assert "`vit-einops convert vit_b_16-c867db91.pth vit_b_16.safetensors`" in message
    assert "\n" not in message and caught.value.__cause__ is None and caught.value.__suppress_context__
    assert not cache.exists() or list(cache.iterdir()) == []


def test_offline_command_line_ends_with_the_one_line(tmp_path, monkeypatch):
    env = {"TORCH_HOME": str(tmp_path), "VIT_EINOPS_WEIGHTS_URL": (url := closed_port_url())}
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    code = "from vit_einops import create_vit; create_vit('vit_b_16', pretrained=True)"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"vit_einops.base.download.DownloadError: create_vit('vit_b_16', pretrained=True) could not "
                           f"fetch {url}/vit_b_16-c867db91.pth")
    assert "During handling" not in done.stderr and "urllib" not in done.stderr  # no chain of library tracebacks


def test_a_download_killed_midway_leaves_no_file_under_the_cached_name(tmp_path, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    cache = tmp_path / "hub" / "checkpoints"
    file = PRETRAINED["vit_b_16"].file
    with serve() as site:
        site.files[file] = bytes(4 << 20)
        site.stall.add(file)
        env = {**os.environ, "TORCH_HOME": str(tmp_path), "VIT_EINOPS_WEIGHTS_URL": site.url}
        code = "from vit_einops import create_vit; create_vit('vit_b_16', pretrained=True)"
        process = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
        try:
            assert site.half_sent.wait(120)
            deadline = time.monotonic() + 60
            while not any(p.stat().st_size for p in cache.glob(f".{file}.*.tmp")) and time.monotonic() < deadline:
                time.sleep(0.05)  # until the first bytes are on disk
            assert any(p.stat().st_size for p in cache.glob(f".{file}.*.tmp"))
            # A second download of the same file meanwhile is told at once, never a second writer.
            busy = rf"is being written by another vit-einops process \(pid {process.pid}"
            with pytest.raises(BlockingIOError, match=busy):
                download(f"{site.url}/{file}", cache / file, sha256_prefix=PRETRAINED["vit_b_16"].sha256_prefix,
                         max_bytes=download_limit("vit_b_16"))
        finally:
            process.kill()
            process.wait()
        assert not (cache / file).exists()  # only a temporary, never the cached name, holds part of a download
        assert [p.name for p in cache.iterdir() if not p.name.endswith((".tmp", ".lock"))] == []
        site.stall.clear()
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "does not start with" in done.stderr  # zeros are not vit_b_16's weights...
    assert sorted(p.name for p in cache.iterdir()) == []  # ...and the killed run's temporary and lock are gone too


# --- timm's names: the Hugging Face hub, through our own client and the hub's cache layout ---

HUB_REPO = f"timm/{NAME}.tag"
COMMIT = "a" * 40


def _publish_hub(monkeypatch, site, data: bytes, repo: str = HUB_REPO) -> None:
    """Serve ``data`` as the real hub serves a model.safetensors: the commit, the ETag (an LFS file's sha256) and
    the size in headers, beside the bytes."""
    path = f"{repo}/resolve/main/model.safetensors"
    sha256 = hashlib.sha256(data).hexdigest()
    site.files[path] = data
    site.headers[path] = {"ETag": f'"{sha256}"', "X-Repo-Commit": COMMIT, "X-Linked-Etag": f'"{sha256}"',
                          "X-Linked-Size": str(len(data))}
    monkeypatch.setenv("HF_ENDPOINT", site.url)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "hf"


def test_timm_names_download_without_huggingface_hub_and_name_the_classes(tiny_model, cache, hub_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as when it is not installed: it is not needed
    monkeypatch.setitem(PRETRAINED, NAME, PublishedWeights("timm", HUB_REPO, 32, 1000, Preprocessing.timm(32, 0.9)))
    with serve() as site:
        _publish_hub(monkeypatch, site, safetensors_save(to_timm(tiny_model), metadata={"format": "pt"}))
        loaded = create_vit(NAME, pretrained=True)
        create_vit(NAME, pretrained=True)
    assert site.requests == [("GET", f"{HUB_REPO}/resolve/main/model.safetensors")]  # the second call read the cache
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in tiny_model.state_dict().items())
    assert loaded.class_names[:2] == ["tench", "goldfish"] and loaded.preprocessing == Preprocessing.timm(32, 0.9)
    assert loaded.source["url"] == f"{site.url}/{HUB_REPO}/resolve/main/model.safetensors"
    assert (hub_cache / f"models--timm--{NAME}.tag" / "snapshots" / COMMIT / "model.safetensors").is_symlink()


def test_a_family_downloads_with_its_arch_and_preprocessing(cache, hub_cache, monkeypatch):
    """create_vit("vit_small_patch14_reg4_dinov2", pretrained=True): the file comes from the family's hub repo,
    loads with the name as its arch (registers, LayerScale, positions for the patches only, no classifier) and
    records DINOv2's preprocessing (ImageNet mean and std, crop 1.0). The architecture is shrunk in the table, so
    the served file is tiny."""
    from vit_einops.pretrained import _timm
    from vit_einops.presets import TIMM_ARCHS

    name = "vit_small_patch14_reg4_dinov2"
    small = dict(dim=32, depth=1, heads=2, mlp_dim=64, image_size=28)
    monkeypatch.setitem(TIMM_ARCHS, name, {**TIMM_ARCHS[name], **small})
    published = _timm(name)
    monkeypatch.setitem(PRETRAINED, name, published)
    model = perturbed(create_vit(name))
    with serve() as site:
        _publish_hub(monkeypatch, site, safetensors_save(to_timm(model), metadata={"format": "pt"}), published.file)
        loaded = create_vit(name, pretrained=True)
    assert published.file == "timm/vit_small_patch14_reg4_dinov2.lvd142m"
    assert loaded.config == model.config and loaded.patch_embed.layout().prefix[1:] == ("reg1", "reg2", "reg3", "reg4")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    assert loaded.preprocessing == Preprocessing.timm(28, 1.0, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    assert loaded.class_names is None and loaded.source["pretrained"] == name


def test_names_without_published_weights_and_bad_arguments(cache):
    with pytest.raises(ValueError, match="no published weights for 'vit_ti_16'; names with weights: vit_b_16, "):
        create_vit("vit_ti_16", pretrained=True)
    with pytest.raises(ValueError, match="unknown preset 'vit_x'"):
        create_vit("vit_x", pretrained=True)
    with pytest.raises(ValueError, match="pretrained=True .* or weights=PATH .*, not both"):
        create_vit("vit_b_16", pretrained=True, weights="w.pth")
    with pytest.raises(TypeError, match="pretrained must be True or False, got 'yes'"):
        create_vit("vit_b_16", pretrained="yes")
    from vit_einops.presets import create_architecture

    with pytest.raises(TypeError, match="architecture only; for weights call vit_einops.create_vit"):
        create_architecture("vit_b_16", pretrained=True)


@pytest.mark.parametrize("form", ["torchvision.pth", "timm.safetensors", "vit-einops.safetensors"])
def test_weights_path_in_any_form(tiny_model, cache, tmp_path, form):
    path = tmp_path / form.replace("vit-einops", "ours")
    if form.startswith("vit-einops"):
        save_vit(tiny_model, path)
    else:
        save_state_dict_file((to_torchvision if form.startswith("torchvision") else to_timm)(tiny_model), path)
    model = create_vit(NAME, weights=path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in tiny_model.state_dict().items())
    assert model.config.heads == TINY["heads"]  # from the name: a state dict cannot tell h


def test_weights_of_another_architecture_are_refused_with_the_fields_that_differ(tiny_model, tmp_path):
    path = save_state_dict_file(to_torchvision(tiny_model), tmp_path / "tv.pth")
    # heads come from the name (a state dict cannot tell them), so they are not among the differences
    with pytest.raises(ValueError, match=r"tv.pth: not a vit_b_16: patch_size \(8, 8\) \(a vit_b_16 has "
                       r"\(16, 16\)\), dim 48 \(a vit_b_16 has 768\), depth 2 \(a vit_b_16 has 12\), "
                       r"mlp_dim 96 \(a vit_b_16 has 3072\); load it as it is with load_model"):
        create_vit("vit_b_16", weights=path)


# --- ImageNet-1k names, and the form of a file recognised without --from ---


def test_1000_class_foreign_files_get_imagenet_names_and_say_they_were_assumed(tiny_model, tmp_path):
    names = imagenet1k_classes()
    assert len(names) == len(set(names)) == 1000 and names[0] == "tench" and names[-1] == "toilet tissue"
    for export, file in ((to_torchvision, "tv.pth"), (to_timm, "timm.safetensors")):
        model = load_model(save_state_dict_file(export(tiny_model), tmp_path / file), heads=4)
        assert model.class_names == names and model.source["class_names"] == ASSUMED
        back = load_model(save_vit(model, tmp_path / f"{file}.safetensors"))  # the provenance travels in the file
        assert back.class_names == names and back.source["class_names"] == ASSUMED
    five = load_model(save_state_dict_file(to_torchvision(ViT(**TINY)), tmp_path / "five.pth"), heads=4)
    assert five.class_names is None and "class_names" not in five.source


def test_forms_are_recognised_from_the_file(tiny_model, tmp_path):
    from vit_einops.interop import save_hf

    files = {
        "torchvision": save_state_dict_file(to_torchvision(tiny_model), tmp_path / "tv.bin"),
        "timm": save_state_dict_file(to_timm(tiny_model), tmp_path / "timm.pth"),
        "vit-einops": save_vit(tiny_model, tmp_path / "m.safetensors"),
        "hf": save_hf(tiny_model, tmp_path / "hf"),
    }
    files["timm-safetensors"] = save_state_dict_file(to_timm(tiny_model), tmp_path / "timm.safetensors")
    for form, path in files.items():
        assert detect_source(path) == form.split("-safetensors")[0], path
    assert detect_source(files["hf"] / "model.safetensors") == "hf"
    run = tmp_path / "run"
    run.mkdir()
    save_vit(tiny_model, run / "model.safetensors")
    (run / "config.json").write_text("{}")  # a run's model file decides, whatever else lies beside it
    assert detect_source(run) == "vit-einops"


def test_ambiguous_unknown_and_configless_files_are_errors_never_guesses(tiny_model, tmp_path):
    both = save_state_dict_file({**to_torchvision(tiny_model), **to_timm(tiny_model)}, tmp_path / "both.pth")
    with pytest.raises(ValueError, match="both.pth: ambiguous: its keys fit torchvision and timm; name its form"):
        detect_source(both)
    other = save_state_dict_file({"fc.weight": torch.zeros(2, 2)}, tmp_path / "resnet.pth")
    with pytest.raises(ValueError, match=r"resnet.pth: not a ViT state dict of a known form: its 1 keys \(fc.weight\) "
                       r"lack the keys each form holds \(torchvision: class_token, conv_proj.weight; timm: "):
        detect_source(other)
    bare = save_state_dict_file(tiny_model.state_dict(), tmp_path / "bare.safetensors")
    with pytest.raises(ValueError, match="bare.safetensors: a vit-einops state dict without its config"):
        load_model(bare)
    with pytest.raises(FileNotFoundError, match="absent.pth: no such model file or directory"):
        detect_source(tmp_path / "absent.pth")


def test_predict_a_torchvision_file_and_its_conversion_without_from_print_imagenet_names(tiny_model, tmp_path, capsys):
    path = save_state_dict_file(to_torchvision(tiny_model), tmp_path / "vit_tiny.pth")
    photo = tmp_path / "photo.png"
    Image.new("RGB", (40, 30), (200, 30, 30)).save(photo)
    top = [p.label for p in predict(load_model(path, heads=4), [photo], top_k=3)[0]]
    assert set(top) <= set(imagenet1k_classes())
    converted = tmp_path / "vit_tiny.safetensors"
    assert main(["convert", str(path), str(converted), "--heads", "4"]) == 0
    assert load_model(converted).source["class_names"] == ASSUMED
    capsys.readouterr()
    for model in ([str(path), "--heads", "4"], [str(converted)]):
        assert main(["predict", *model, str(photo), "--top-k", "3"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == str(photo) and len(lines) == 4
        assert [line.split("%  ", 1)[1].rsplit("  (", 1)[0] for line in lines[1:]] == top


def test_an_empty_or_non_path_weights_argument_is_refused_never_read_from_the_current_directory(tiny_model, cache):
    save_vit(tiny_model, "model.safetensors")  # in the test's own empty cwd: what Path("") would have loaded
    with pytest.raises(ValueError, match=r"^weights is an empty string; expected a model file or directory$"):
        create_vit(NAME, weights="")
    with pytest.raises(ValueError, match=r"^path is an empty string; expected a model file or directory$"):
        load_model("")
    expected = r"^weights must be a model file or directory \(str or os.PathLike\), got True$"
    with pytest.raises(TypeError, match=expected):
        create_vit(NAME, weights=True)  # pretrained=True's twin; pathlib said "expected str, bytes or os.PathLike"
    assert isinstance(create_vit(NAME, weights="model.safetensors"), ViT)  # the same file, named, loads


def test_a_mistyped_weights_host_is_the_one_line_download_error(cache, monkeypatch):
    monkeypatch.setenv("VIT_EINOPS_WEIGHTS_URL", "downloads.example")  # no scheme
    with pytest.raises(DownloadError, match=r"^create_vit\('vit_b_16', pretrained=True\) could not fetch "
                       r"downloads.example/vit_b_16-c867db91.pth: it is not an http or https URL. .*"
                       r"weights='vit_b_16-c867db91.pth'"):
        create_vit("vit_b_16", pretrained=True)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_cached_file_damaged_after_its_download_says_to_delete_it(tiny_model, cache, monkeypatch):
    data = _torchvision_bytes(tiny_model)
    with serve() as site:
        file = _publish(monkeypatch, site, data)
        create_vit(NAME, pretrained=True)
        assert site.requests == [("GET", file)]
        (cache / file).write_bytes(data[: len(data) // 2])  # a copy cut short over the cached file
        damaged = rf"{file}: the cached download of these weights is damaged .* delete it to download it again \("
        with pytest.raises(ValueError, match=damaged):
            create_vit(NAME, pretrained=True)
        (cache / file).unlink()
        assert isinstance(create_vit(NAME, pretrained=True), ViT)  # deleted: downloaded again, and loads
    assert len(site.requests) == 2
