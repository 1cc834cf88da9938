"""perfladder.config: presets, pick_config, GPTConfig validation."""
from __future__ import annotations

import pytest

from perfladder import config
from perfladder.config import (
    CONFIG_NAMES,
    PRESETS,
    GPTConfig,
    LadderConfig,
    expected_num_params,
    get_config,
    pick_config,
)


def test_presets():
    assert CONFIG_NAMES == ("full", "smoke")
    full, smoke = get_config("full"), get_config("smoke")
    assert isinstance(full, LadderConfig) and full is PRESETS["full"]
    assert (full.num_hiddens, full.num_blks, full.num_heads, full.num_steps) == (512, 6, 8, 128)
    assert (full.batch_size, full.big_batch) == (64, 512)
    assert smoke.is_smoke and not full.is_smoke
    # the smoke data split must hold whole big batches, or the batch-up rung cannot run
    for cfg in (full, smoke):
        assert cfg.num_train // cfg.big_batch >= 1 and cfg.windows >= 1 and cfg.timed >= 1


def test_ladder_config_builds_gpt_config():
    full = get_config("full")
    g = full.gpt()
    assert g == GPTConfig(vocab_size=28, num_hiddens=512, num_blks=6, num_heads=8, max_len=128)
    assert g.head_dim == 64 and g.pos == "rope" and g.ln_eps == 1e-5
    assert full.gpt(pos="learned").pos == "learned"
    assert full.replace(batch_size=32).batch_size == 32 and full.batch_size == 64
    assert full.to_dict()["big_batch"] == 512
    assert get_config("smoke").gpt().max_len >= get_config("smoke").num_steps


def test_get_config_unknown_lists_choices():
    with pytest.raises(ValueError, match=r"unknown config 'smok'.*valid choices: \('full', 'smoke'\)"):
        get_config("smok")


def test_pick_config_argument_wins(monkeypatch, capsys):
    monkeypatch.setenv("PERFLADDER_CONFIG", "full")
    assert pick_config("smoke", has_gpu=True).name == "smoke"
    out = capsys.readouterr().out
    assert "smoke (argument)" in out and "NOT performance results" in out


def test_pick_config_env_var(monkeypatch, capsys):
    monkeypatch.setenv("PERFLADDER_CONFIG", "full")
    assert pick_config(has_gpu=False).name == "full"
    assert "full ($PERFLADDER_CONFIG)" in capsys.readouterr().out


def test_pick_config_bad_env_var_says_where_it_came_from(monkeypatch):
    monkeypatch.setenv("PERFLADDER_CONFIG", "huge")
    with pytest.raises(ValueError, match=r"'huge'.*valid choices.*\$PERFLADDER_CONFIG"):
        pick_config(has_gpu=True)


@pytest.mark.parametrize("has_gpu, name", [(True, "full"), (False, "smoke")])
def test_pick_config_from_device(monkeypatch, capsys, has_gpu, name):
    monkeypatch.delenv("PERFLADDER_CONFIG", raising=False)
    assert pick_config(has_gpu=has_gpu).name == name
    assert ("GPU found" if has_gpu else "no GPU found") in capsys.readouterr().out


def test_pick_config_asks_the_machine_when_not_told(monkeypatch):
    monkeypatch.delenv("PERFLADDER_CONFIG", raising=False)
    monkeypatch.setattr(config, "gpu_present", lambda: False)
    assert pick_config(verbose=False).name == "smoke"
    monkeypatch.setattr(config, "gpu_present", lambda: True)
    assert pick_config(verbose=False).name == "full"


def test_pick_config_bad_name():
    with pytest.raises(ValueError, match="valid choices"):
        pick_config("fulll", has_gpu=True)


@pytest.mark.parametrize("kw, msg", [
    (dict(pos="alibi"), r"pos='alibi'.*valid choices: \('rope', 'learned'\)"),
    (dict(num_hiddens=0), "num_hiddens=0 must be a positive integer"),
    (dict(num_blks=2.0), "num_blks=2.0 must be a positive integer"),
    (dict(num_heads=True), "num_heads=True must be a positive integer"),
    (dict(num_hiddens=30, num_heads=4), "not divisible"),
    (dict(num_hiddens=24, num_heads=8), "RoPE needs an even head width"),
    (dict(ln_eps=0.0), "ln_eps=0.0 must be a finite number > 0"),
    (dict(rope_base=-1.0), "rope_base"),
])
def test_gpt_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        GPTConfig(**kw)


def test_odd_head_width_is_fine_without_rope():
    assert GPTConfig(num_hiddens=24, num_heads=8, pos="learned").head_dim == 3


def test_expected_num_params_by_hand():
    # D=8, m=4, L=1, V=5: block = 3*64+24 + 64+8 + 256+32 + 256+8 + 32 = 872; + V*D + 2D
    cfg = GPTConfig(vocab_size=5, num_hiddens=8, num_blks=1, num_heads=2)
    assert expected_num_params(cfg) == 872 + 40 + 16
    learned = GPTConfig(vocab_size=5, num_hiddens=8, num_blks=1, num_heads=2, max_len=10, pos="learned")
    assert expected_num_params(learned) == 872 + 40 + 16 + 80


def test_flops_per_token_formula():
    assert config.flops_per_token(1000, 2, 16, 8) == 6 * 1000 + 12 * 2 * 16 * 8


def test_window_and_warmup_steps_keep_their_tokens_past_the_big_batch():
    full = config.get_config("full")              # warmup 30, timed 40, big batch 512
    assert [full.timed_steps(b) for b in (64, 512, 1024, 2048, 1 << 20)] == [40, 40, 20, 10, 2]
    assert [full.warmup_steps(b) for b in (64, 512, 1024, 2048, 1 << 20)] == [30, 30, 15, 8, 5]
    smoke = config.get_config("smoke")            # warmup 2: the floor never raises it
    assert smoke.warmup_steps(4 * smoke.big_batch) == 2 and smoke.timed_steps(4 * smoke.big_batch) == 2
