"""AttnLRP and CP-LRP (vit_einops.inspect.lrp): conservation layer by layer on a tiny model of every family, for a
class and for backbone targets, the maps on every attention path, the forward pass left as it is, and the refusals.
float64 throughout, so that rounding is far below what the tolerances hold. lxt 2.1 on a torchvision twin of the
same weights: tests/test_interop_lrp.py.

Conservation is read with every bias zero (the Linears', the LayerNorms', E_pos, the prefix tokens and the
attention pool's latent query: LRP counts each as a bias, which absorbs relevance) and the Gamma rule's stabilizer at
1e-12 (zennit's 1e-6 moves a tiny model's small outputs by a relative 1e-3)."""

from __future__ import annotations

import re

import pytest
import torch
from _tiny import FAMILIES, TINY_DIGITS, tiny_vit

from vit_einops.inspect import METHODS, EmbeddingTarget, PatchTarget, explain, lrp
from vit_einops.inspect.integrated_gradients import patch_sums
from vit_einops.inspect.lrp import lrp_rules
from vit_einops.network.attention import Attend
from vit_einops.network.probes import attached, module_hooks

TINY = dict(TINY_DIGITS, num_classes=5)
EXACT = dict(stabilizer=1e-12)  # the Gamma rule's denominators as they are: see the module docstring
# The parts no family of _tiny has, each with a rule or a layer of its own: the patch embedding's Linear, the tanh
# pre-logits layer, CLIP's pre-norm and QuickGELU, BEiT's q and v biases.
PARTS = {**FAMILIES, "other parts": dict(patchify="linear", representation_size=12, pre_norm=True, act="quick_gelu",
                                         qkv_bias="qv")}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one torch thread runs them fastest on a shared machine."""


def _model(unbiased=False, **options):
    torch.manual_seed(0)
    model = tiny_vit(TINY, **options).double()
    with torch.no_grad():  # noise on every parameter: the zero-initialised head and biases would hide a slip
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
            if unbiased and (name.endswith(("bias", "latent")) or name.startswith(("patch_embed.cls", "patch_embed.dist",
                                                                                 "patch_embed.reg", "patch_embed.pos"))):
                p.zero_()
    return model


def _relevances(model, x, rule, target=None, **params):
    """The relevance summed per image (b,) at the pixels, at each block's input, at the last block's output and at
    the score, in that order; and what each attention's softmax absorbs (b,) under AttnLRP, in the same order (the
    encoder's layers, then the attention pool's): half the difference between the relevance at A and at its logits
    (AttnLRP's halving at A v). The rules are lrp's; the sums are read at the probe sites."""
    forward, pre = lrp_rules(model, rule, **params)
    sites = model.probe_sites()
    depth = len(model.blocks)
    names = [f"blocks.{l}.hook_resid_pre" for l in range(depth)] + [f"blocks.{depth - 1}.hook_resid_post"]
    kept, softmax = {}, []

    def keep(value, hook):
        kept[hook.name] = value

    def keep_softmax(module, inputs, output):
        softmax.append((inputs[0], output))

    def formed(value, hook):  # probed, every kernel forms A through its softmax module
        return None

    probes = [(sites[n], keep) for n in names] + [(sites[f"blocks.{l}.attn.hook_pattern"], formed) for l in range(depth)]
    if rule == "attnlrp":
        forward = forward + [(m.softmax, keep_softmax) for m in model.modules() if isinstance(m, Attend)]
    with module_hooks(forward, pre), attached(probes), torch.enable_grad():
        x = x.detach().requires_grad_(True)
        logits = model(x)
        score = logits.gather(1, logits.argmax(-1, keepdim=True))[:, 0] if target is None else target(logits)
        tensors = [x, *kept.values(), *(t for pair in softmax for t in pair)]
        grads = torch.autograd.grad(score.sum(), tensors)
    sums = [(t * g).flatten(1).sum(1) for t, g in zip(tensors, grads)]
    stages, pairs = sums[: len(names) + 1], sums[len(names) + 1 :]
    absorbed = [(pairs[2 * i + 1] - pairs[2 * i]) / 2 for i in range(len(softmax))]
    return [*stages, score.detach()], absorbed


@pytest.mark.parametrize("family", list(PARTS))
def test_the_relevance_is_conserved_layer_by_layer_on_every_family(family):
    """Biases zero: under CP-LRP each block passes on exactly the relevance it receives, from the score to the
    pixels, at the default gammas as at 0 (the Gamma rule's shares of an output sum to its relevance). Under AttnLRP
    each block passes on what it receives less what its softmax absorbs, and the attention pool's softmax takes its
    share between the last block and the score."""
    model, x = _model(unbiased=True, **PARTS[family]), torch.randn(2, 1, 8, 8, dtype=torch.float64)
    for rule in ("cp-lrp", "attnlrp"):
        for gammas in (dict(patch_gamma=0.0, linear_gamma=0.0), {}):
            stages, absorbed = _relevances(model, x, rule, **gammas, **EXACT)
            score = stages[-1]
            zero, depth = torch.zeros_like(score), len(model.blocks)
            blocks, pool = (absorbed[:depth], absorbed[depth:] or [zero]) if absorbed else ([zero] * depth, [zero])
            losses = [zero, *blocks, *pool]  # what goes missing between stage i and stage i + 1
            assert len(losses) == len(stages) - 1
            for i, loss in enumerate(losses):
                torch.testing.assert_close(stages[i], stages[i + 1] - loss, rtol=1e-6, atol=1e-6 * score.abs().max())
            total = sum(losses)
            assert ((stages[0] - (score - total)).abs() <= 1e-4 * score.abs()).all(), (rule, gammas)
            if rule == "cp-lrp":
                assert not absorbed
            else:
                assert len(absorbed) == len(model.blocks) + (family == "attention pool")
                assert (total.abs() > 1e-3 * score.abs()).all()  # the softmax does absorb: the accounting is no 0 = 0


@pytest.mark.parametrize("rule", ["cp-lrp", "attnlrp"])
def test_backbone_targets_start_from_their_score(rule):
    """A cosine similarity is differentiated with its norms held constant (and a patch target's dot products by the
    uniform rule), so the relevance starts as the score: under CP-LRP, biases zero, the pixels' sum is the score;
    under AttnLRP the score less what the softmaxes absorb."""
    model, x = _model(unbiased=True, num_classes=0), torch.randn(2, 1, 8, 8, dtype=torch.float64)
    embedding = EmbeddingTarget(torch.randn(TINY["dim"], dtype=torch.float64))
    patch = PatchTarget(1, 2)
    for target in (embedding, patch):
        pixels = lrp(model, x, target, rule=rule, preprocessed=True, **EXACT).sum((1, 2, 3))
        if isinstance(target, PatchTarget):
            score = target.similarity(model.forward_features(x), model.patch_embed.layout()).flatten(1).mean(-1)
        else:
            score = target.scores(model(x))
        if rule == "cp-lrp":
            torch.testing.assert_close(pixels, score, rtol=1e-4, atol=0)
        elif isinstance(target, EmbeddingTarget):  # AttnLRP: the score less what the softmaxes absorb
            e = embedding.vector / embedding.vector.norm()
            held = lambda y: (y / y.norm(dim=-1, keepdim=True).detach() * e).sum(-1)  # noqa: E731
            stages, absorbed = _relevances(model, x, rule, held, **EXACT)
            torch.testing.assert_close(stages[-1], score.detach(), rtol=1e-12, atol=0)
            torch.testing.assert_close(pixels, score.detach() - sum(absorbed), rtol=1e-6, atol=0)


@pytest.mark.parametrize("family", ["vit", "rope"])
def test_the_maps_sum_each_patch_and_agree_on_every_attention_path(family):
    model, x = _model(**FAMILIES[family]), torch.randn(2, 1, 8, 8, dtype=torch.float64)
    for rule in ("attnlrp", "cp-lrp"):
        pixels = lrp(model, x, 3, rule=rule, preprocessed=True)
        expected = pixels.view(2, 1, 4, 2, 4, 2).sum(dim=(1, 3, 5))  # (b, c, gh, p1, gw, p2): each 2x2 patch's sum
        torch.testing.assert_close(patch_sums(model, pixels), expected, rtol=0, atol=0)
        for impl in ("einsum", "chunked", "sdpa"):
            model.set_attn_impl(impl)
            grid = explain(model, x, rule, 3, preprocessed=True)
            torch.testing.assert_close(grid, expected, rtol=0, atol=1e-12, msg=f"{rule} {impl}")
        model.set_attn_impl("einsum")
        assert METHODS[rule].gradient


def test_the_rules_change_the_backward_pass_only_and_leave_nothing_behind():
    """Under the rules the logits are the model's; after lrp (also after one that raised) the model's gradient is
    the plain gradient again, and the rules do change it while attached."""
    model, x = _model(rope_grid=4, ffn="swiglu", qk_norm=True), torch.randn(2, 1, 8, 8, dtype=torch.float64)

    def gradient():
        xg = x.clone().requires_grad_(True)
        logits = model(xg)
        return logits, torch.autograd.grad(logits[:, 1].sum(), xg)[0]

    plain_logits, plain = gradient()
    for rule in ("attnlrp", "cp-lrp"):
        forward, pre = lrp_rules(model, rule)
        with module_hooks(forward, pre):
            logits, ruled = gradient()
        torch.testing.assert_close(logits, plain_logits, rtol=0, atol=1e-12)
        assert not torch.allclose(ruled, plain)
        with pytest.raises(ValueError, match="target classes must be in 0..4"):
            lrp(model, x, 7, rule=rule, preprocessed=True)
        again_logits, again = gradient()
        torch.testing.assert_close(again, plain, rtol=0, atol=0)
        torch.testing.assert_close(again_logits, plain_logits, rtol=0, atol=0)


def test_refusals_name_the_value_and_what_is_expected():
    model, x = _model(), torch.randn(1, 1, 8, 8, dtype=torch.float64)
    cases = [
        (ValueError, dict(patch_gamma=-0.5), "patch_gamma must be a finite float >= 0, got -0.5"),
        (ValueError, dict(linear_gamma=float("nan")), "linear_gamma must be a finite float >= 0, got nan"),
        (TypeError, dict(linear_gamma=True), "linear_gamma must be a finite float >= 0, got True of type bool"),
        (ValueError, dict(stabilizer=0), "stabilizer must be a positive finite float, got 0.0"),
        (TypeError, dict(gamma=0.1), "method 'attnlrp' takes no parameter gamma (its parameters: patch_gamma, "
                                     "linear_gamma, stabilizer)"),
    ]
    for error, params, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            explain(model, x, "attnlrp", 0, preprocessed=True, **params)
    with pytest.raises(ValueError, match=re.escape("unknown rule 'lrp-0'")):
        lrp(model, x, rule="lrp-0", preprocessed=True)
    with pytest.raises(ValueError, match="cp-lrp explains one class per image"):
        lrp(model, x, [[0, 1]], rule="cp-lrp", preprocessed=True)
    with pytest.raises(ValueError, match=r"this model has no classifier .*there is no predicted class"):
        lrp(_model(num_classes=0), x, preprocessed=True)
