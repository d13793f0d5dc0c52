"""lxt 2.1's relevance on torchvision's ViT, for tests/test_interop_lrp.py, run as a process of its own:
``python _lxt_reference.py RULE JOBS OUT``. lxt patches torchvision's and zennit's classes for the whole process,
so no other test may share it.

JOBS (torch.save) is a list of jobs, each holding ``kwargs`` (torchvision's VisionTransformer), ``state`` (its state
dict), ``x`` (b, 3, H, W), ``classes`` (b,) and ``gammas``, a list of (Conv2d gamma, Linear gamma); OUT receives, per
job, one relevance (b, 3, H, W) per gamma pair: the input times its gradient, as lxt's ViT example computes it.

RULE "cp-lrp" applies lxt's own patch map for torchvision's ViT (``lxt/efficient/models/vit_torch.py``'s
``cp_LRP``: the identity rule on GELU and LayerNorm, q and k detached in ``nn.MultiheadAttention``). For "attnlrp"
lxt ships no map for torchvision, so the reference takes that map's GELU and LayerNorm entries and replaces
``nn.MultiheadAttention.forward`` by an eager attention over the layer's own weights (in_proj, then A v, then
out_proj, both as F.linear, as ``F.multi_head_attention_forward`` runs them) wrapped in lxt's own
``wrap_attention_forward``, which divides q's and k's gradients by 4 and v's by 2. Both then register zennit's
``Gamma`` on every Conv2d and Linear module (a ``LayerMapComposite``) after lxt's ``monkey_patch_zennit``.

lxt's package inits are not run: ``lxt/efficient/__init__.py`` imports ``efficient/core.py``, whose
``efficient/models/__init__.py`` imports lxt's patches of every language model in transformers (its older BERT
among them), which the installed transformers need not have. Empty modules stand in for the packages ``lxt``,
``lxt.efficient`` and ``lxt.efficient.models`` in ``sys.modules``, each with lxt's folder as its ``__path__``, so
that ``rules.py``, ``patches.py``, ``zennit_patches.py`` and ``models/vit_torch.py`` import by their names, as
their own imports of each other expect, and nothing else of lxt runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import types

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import vision_transformer
from zennit.composites import LayerMapComposite
from zennit.rules import Gamma


def lxt_modules() -> dict[str, types.ModuleType]:
    """lxt's rules, patches, zennit_patches and models.vit_torch, imported without lxt's package inits."""
    root = importlib.util.find_spec("lxt").submodule_search_locations[0]
    for name, folder in (("lxt", root), ("lxt.efficient", f"{root}/efficient"),
                         ("lxt.efficient.models", f"{root}/efficient/models")):  # fmt: skip
        package = types.ModuleType(name)
        package.__path__ = [folder]
        sys.modules[name] = package
    names = ("rules", "patches", "zennit_patches", "models.vit_torch")
    return {name: importlib.import_module(f"lxt.efficient.{name}") for name in names}


def eager_attention(module, query, key, value):
    """softmax(q k^T / sqrt(d)) v on (b, h, n, d) tensors: the attention lxt's wrapper wraps."""
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
    return weights @ value


def attnlrp_forward(lxt):
    """nn.MultiheadAttention.forward for torchvision's EncoderBlock (self-attention, batch first, no mask, no
    weights returned) with lxt's uniform rule on q, k and v."""
    attend = lxt["patches"].wrap_attention_forward(eager_attention)

    def forward(self, query, key, value, *args, **kwargs):
        b, n, d = query.shape
        q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.num_heads, d // self.num_heads).transpose(1, 2) for t in (q, k, v))
        out = attend(self, q, k, v).transpose(1, 2).reshape(b, n, d)
        return F.linear(out, self.out_proj.weight, self.out_proj.bias), None

    return forward


def main(rule: str, jobs_path: str, out_path: str) -> None:
    lxt = lxt_modules()
    patch_map = dict(lxt["models.vit_torch"].cp_LRP)
    if rule == "attnlrp":
        patch_map[vision_transformer.nn.MultiheadAttention] = lambda target: lxt["patches"].patch_method(
            attnlrp_forward(lxt), target, keep_original=True
        )
    for target, patch in patch_map.items():  # what lxt.efficient.monkey_patch does with a patch map
        assert patch(target), target
    lxt["zennit_patches"].monkey_patch_zennit()
    torch.set_num_threads(1)  # as the test's side: one thread, one order of every sum
    torch.save([relevances(**job) for job in torch.load(jobs_path)], out_path)


def relevances(kwargs, state, x, classes, gammas):
    """One job's relevance per gamma pair, on the patched classes."""
    model = vision_transformer.VisionTransformer(**kwargs).to(x.dtype)
    model.load_state_dict(state)
    model.eval()
    for param in model.parameters():  # as lxt's example: relevance flows to the input only
        param.requires_grad = False
    results = []
    for conv_gamma, linear_gamma in gammas:
        composite = LayerMapComposite([(nn.Conv2d, Gamma(conv_gamma)), (nn.Linear, Gamma(linear_gamma))])
        composite.register(model)
        inputs = x.clone().requires_grad_(True)
        logits = model(inputs)
        logits.gather(1, classes[:, None]).sum().backward()  # images do not interact
        composite.remove()
        results.append((inputs * inputs.grad).detach())
    return results


if __name__ == "__main__":
    main(*sys.argv[1:])
