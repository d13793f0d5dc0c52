"""The published weights' table (vit_einops.pretrained.PRETRAINED) and the shipped ImageNet-1k names, checked
against torchvision's and timm's own, and the hub cache create_vit(pretrained=True) shares with huggingface_hub
(timm's client), each reading the other's files. Runs in the interop environment (.ci/run-interop); elsewhere it
skips with the reason."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from _interop import TINY, interop_library, perturbed

interop_library("torchvision")
timm = interop_library("timm")
interop_library("huggingface_hub")

import torchvision.models as tvm  # noqa: E402
from _loopback import serve  # noqa: E402
from safetensors.torch import save as safetensors_save  # noqa: E402
from torchvision.models._meta import _IMAGENET_CATEGORIES  # noqa: E402

from vit_einops import ViT, create_vit  # noqa: E402
from vit_einops.imagenet import imagenet1k_classes  # noqa: E402
from vit_einops.interop import to_timm  # noqa: E402
from vit_einops.pretrained import PRETRAINED, TORCHVISION_URL, PublishedWeights, weights_url  # noqa: E402
from vit_einops.preprocess import Preprocessing  # noqa: E402
from vit_einops.presets import PRESETS  # noqa: E402
from vit_einops.presets import FAMILIES, TIMM_ARCHS  # noqa: E402

TORCHVISION_NAMES = [name for name, w in PRETRAINED.items() if w.library == "torchvision"]
TIMM_NAMES = [name for name, w in PRETRAINED.items() if w.library == "timm"]


def test_shipped_names_are_torchvisions_and_every_name_with_weights_is_a_preset():
    assert imagenet1k_classes() == list(_IMAGENET_CATEGORIES)
    assert TORCHVISION_NAMES == ["vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14"]
    # every timm name of the registry, and the tags of the families that are another's tags (DINO, MAE)
    tagged = {
        f"{name}.{tag}" for f in FAMILIES.values() if not f.members for name, tags in f.tags.items() for tag in tags
    }
    assert set(TIMM_NAMES) == set(TIMM_ARCHS) | tagged >= {"vit_small_patch16_224.dino", "vit_base_patch16_224.mae"}


@pytest.mark.parametrize("name", TORCHVISION_NAMES)
def test_torchvision_entries_are_torchvisions_default_weights(name, monkeypatch):
    monkeypatch.delenv("VIT_EINOPS_WEIGHTS_URL", raising=False)
    default = tvm.get_model_weights(name).DEFAULT
    ours = PRETRAINED[name]
    assert weights_url(name) == default.url and weights_url(name).startswith(TORCHVISION_URL)
    assert default.url.endswith(f"-{ours.sha256_prefix}.pth")  # torch.hub's HASH_REGEX reads the same prefix
    transform = default.transforms()
    assert ours.preprocessing == Preprocessing(
        resize=transform.resize_size[0],
        crop=(transform.crop_size[0],) * 2,
        interpolation=transform.interpolation.value,
        mean=tuple(transform.mean),
        std=tuple(transform.std),
    )
    assert (ours.image_size,) * 2 == default.meta["min_size"]
    assert ours.num_classes == len(default.meta["categories"])


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_timm_entries_are_timms_default_tags(name, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    cfg = timm.models.get_pretrained_cfg(name).to_dict()
    ours = PRETRAINED[name]
    assert ours.file == cfg["hf_hub_id"] and (cfg.get("hf_hub_filename") or "model.safetensors") == "model.safetensors"
    assert weights_url(name) == f"https://huggingface.co/{cfg['hf_hub_id']}/resolve/main/model.safetensors"
    assert (3, ours.image_size, ours.image_size) == cfg["input_size"] and ours.num_classes == cfg["num_classes"]
    assert ours.preprocessing == Preprocessing.timm(
        crop=ours.image_size, crop_pct=cfg["crop_pct"], interpolation=cfg["interpolation"], mean=cfg["mean"],
        std=cfg["std"],
    )


# --- the hub cache: huggingface_hub (timm's client) reads what create_vit cached, and create_vit what it cached ---

NAME = "vit_tiny_test"
REPO = "timm/vit_tiny_test.tag"
COMMIT = "a" * 40


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A hub on 127.0.0.1 serving REPO's model.safetensors (a tiny model's) as the real hub does: the commit, the
    ETag (the sha256 of an LFS file) and the size in headers, to HEAD (huggingface_hub's) and GET."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setitem(PRESETS, NAME, {**TINY, "num_classes": 1000})
    monkeypatch.setitem(PRETRAINED, NAME, PublishedWeights("timm", REPO, 32, 1000, Preprocessing.timm(32, 0.9)))
    model = perturbed(ViT(**{**TINY, "num_classes": 1000}))
    data = safetensors_save(to_timm(model), metadata={"format": "pt"})
    sha256 = hashlib.sha256(data).hexdigest()
    with serve() as site:
        path = f"{REPO}/resolve/main/model.safetensors"
        site.files[path] = data
        site.headers[path] = {"ETag": f'"{sha256}"', "X-Repo-Commit": COMMIT, "X-Linked-Etag": f'"{sha256}"',
                              "X-Linked-Size": str(len(data))}
        monkeypatch.setenv("HF_ENDPOINT", site.url)
        yield site, model, data


def test_huggingface_hub_reads_the_file_create_vit_cached(hub, tmp_path):
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    site, model, data = hub
    create_vit(NAME, pretrained=True)
    cached = try_to_load_from_cache(REPO, "model.safetensors", cache_dir=tmp_path / "hf")
    blob = tmp_path / "hf" / "models--timm--vit_tiny_test.tag" / "blobs" / hashlib.sha256(data).hexdigest()
    assert isinstance(cached, str) and Path(cached).resolve() == blob
    local = hf_hub_download(REPO, "model.safetensors", cache_dir=tmp_path / "hf", local_files_only=True)
    assert Path(local).read_bytes() == data
    assert [r for r in site.requests if r[1].startswith(REPO)] == [("GET", f"{REPO}/resolve/main/model.safetensors")]


def test_create_vit_reads_the_file_huggingface_hub_cached(hub, tmp_path):
    from huggingface_hub import hf_hub_download

    site, model, data = hub
    path = hf_hub_download(REPO, "model.safetensors", cache_dir=tmp_path / "hf", endpoint=site.url)
    assert Path(path).read_bytes() == data
    seen = list(site.requests)
    loaded = create_vit(NAME, pretrained=True)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    assert site.requests == seen  # no request: huggingface_hub's cache entry was used
