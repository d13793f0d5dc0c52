"""One home, one meaning: composed modules hand keyword arguments to their children by name, and each concept has one
registry (the ViT families in presets.py; Hugging Face's architectures are a table of their own, named so)."""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from torch import nn

from vit_einops import ResidualAdd
from vit_einops.network.blocks import FFN_BLOCKS
from vit_einops.network.config import FFNS


class Shift(nn.Module):
    """x + offset, the offset given by keyword (as the attention's ``rope``)."""

    def forward(self, x: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
        return x + offset


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


def test_residual_add_gives_a_keyword_to_the_child_that_takes_it_by_name():
    """The keyword reaches the child whose forward names it, wherever it sits in the branch (here first and last,
    where routing by position would hand it to the second)."""
    x = torch.zeros(1, 2)
    first = ResidualAdd(Shift(), Double())
    last = ResidualAdd(Double(), Double(), Shift())
    assert torch.equal(first(x, offset=1.0), torch.full((1, 2), 2.0))  # 0 + 2 * (0 + 1)
    assert torch.equal(last(x, offset=1.0), torch.full((1, 2), 1.0))  # 0 + 4 * 0 + 1
    assert torch.equal(first.branch(x + 1, offset=1.0), torch.full((1, 2), 4.0))


def test_residual_add_refuses_a_keyword_none_of_its_children_takes():
    with pytest.raises(TypeError, match=r"keyword arguments \['scale'\] that none of its modules takes: 0 \(Double\)"):
        ResidualAdd(Double())(torch.zeros(1, 2), scale=2.0)


def test_state_dict_keys_are_the_saved_files_keys():
    """Routing by name leaves the children, and so the keys every saved file holds, as they were."""
    model = tiny_vit(TINY_RGB16, depth=1, layer_scale=1e-5, rope_grid=4, register_tokens=1, pos_embed_prefix=False)
    block = ["norm.weight", "norm.bias", "mha.qkv.weight", "mha.qkv.bias", "mha.proj.weight", "mha.proj.bias"]
    mlp = ["norm.weight", "norm.bias", "ff.fc1.weight", "ff.fc1.bias", "ff.fc2.weight", "ff.fc2.bias"]
    assert list(model.state_dict()) == [
        "patch_embed.proj.weight", "patch_embed.proj.bias", "patch_embed.pos_embed.weight",
        "patch_embed.cls_token.weight", "patch_embed.reg_token.weight",
        *(f"blocks.0.attn.{k}" for k in block), "blocks.0.attn.ls.gamma",
        *(f"blocks.0.mlp.{k}" for k in mlp), "blocks.0.mlp.ls.gamma",
        "head.norm.weight", "head.norm.bias", "head.fc.weight", "head.fc.bias",
    ]  # fmt: skip
    attn = model.blocks[0].attn
    assert isinstance(attn, nn.Sequential) and list(attn._modules) == ["norm", "mha", "ls"]


def test_rope_reaches_the_attention_by_name():
    """With RoPE the block hands ``rope`` to its attention branch: the output is the attention's own on the rotated
    q and k, so a model with RoPE differs from the same weights run without it."""
    model = tiny_vit(TINY_RGB16, rope_grid=4)
    x = torch.randn(1, 3, 16, 16)
    tokens = model.patch_embed(x)
    rope = model.rope((4, 4), model.num_prefix_tokens)
    block = model.blocks[0]
    with_rope = block.attn.branch(tokens, rope=rope)
    normed = block.attn.norm(tokens)
    torch.testing.assert_close(with_rope, block.attn.mha(normed, rope=rope), rtol=0, atol=0)
    assert not torch.allclose(with_rope, block.attn.mha(normed))


def test_each_ffn_name_has_its_block():
    """config.FFNS names the MLPs (no torch there); blocks.FFN_BLOCKS maps each name to its module, one each."""
    assert tuple(FFN_BLOCKS) == FFNS


def test_one_create_vit():
    """create_vit has one home (pretrained.py, with or without weights); presets.py builds an architecture under a
    name that says so, and refuses weights by pointing to create_vit."""
    from vit_einops import create_vit, presets, pretrained

    assert create_vit is pretrained.create_vit and not hasattr(presets, "create_vit")
    model = create_vit("vit_ti_16", depth=1, num_classes=3)
    architecture = presets.create_architecture("vit_ti_16", depth=1, num_classes=3)
    assert model.config == architecture.config
    with pytest.raises(TypeError, match="presets.create_architecture builds the architecture only; for weights call "):
        presets.create_architecture("vit_ti_16", weights="w.pth")


def test_one_family_registry_lists_every_family_once():
    """presets.FAMILIES is the one registry of ViT families, each under its own name, each timm name a member of one;
    Hugging Face's architectures are a table of their own, HF_ARCHITECTURES, each under its class name and each held
    by one family (its ``hf``)."""
    from vit_einops import FAMILIES, presets
    from vit_einops.interop import hf_families

    assert FAMILIES is presets.FAMILIES and all(name == family.name for name, family in FAMILIES.items())
    members = [name for family in FAMILIES.values() for name in family.members]
    assert len(members) == len(set(members)) == len(presets.TIMM_ARCHS)
    assert not {"FAMILIES", "Family", "family_of"} & set(vars(hf_families))
    assert all(name == arch.architecture for name, arch in hf_families.HF_ARCHITECTURES.items())
    held = [arch for family in FAMILIES.values() for arch in family.hf]
    assert sorted(held) == sorted(hf_families.HF_ARCHITECTURES)
