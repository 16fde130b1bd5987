"""Configs: validation, canonical JSON, kernel names, named configs. CPU only."""
from __future__ import annotations

import dataclasses
import json

import pytest

from blackwell_sparsek import AttentionConfig, Arch, DType, InvalidConfigError, Schedule
from blackwell_sparsek.jit.spec import KernelConfig, config_names, get_config, load_config_file, load_named_configs, resolve_config
from blackwell_sparsek.jit.codegen import render

# The kernels sparse_attention picks by default: both two-warpgroup schedules at D=128 (5 stages) and D=64
# (8 stages), the single-warpgroup kernel at D=64 and the dual kernel of 64x64 blocks (three streams at D=64), in
# fp16 and bf16.
REQUIRED_NAMES = {
    f"bsk_sm90a_attn_fwd_d{d}_{dt}_t128x128_{s}_s{st}_b128x128"
    for d, st in ((128, 5), (64, 8)) for dt in ("fp16", "bf16") for s in ("coop", "pp")
} | {f"bsk_sm90a_attn_fwd_d64_{dt}_t64x128_single_s4_b128x128" for dt in ("fp16", "bf16")} | {
    f"bsk_sm90a_attn_fwd_d{d}_{dt}_t64x64_{sc}_s{st}_b64x64" for d, sc, st in ((128, "dual", 5), (64, "dual3", 7))
    for dt in ("fp16", "bf16")}


def test_required_named_configs_exist_and_validate():
    configs = load_named_configs()
    assert REQUIRED_NAMES <= set(configs)
    for name, cfg in configs.items():
        assert isinstance(cfg, KernelConfig)
        assert cfg.problems() == [], name
        cfg.validate()


@pytest.mark.parametrize("name", sorted(REQUIRED_NAMES))
def test_named_config_matches_its_name(name):
    cfg = get_config(name)
    _, arch, _, _, d, dt, tiles, sched, stages, blocks = name.split("_")
    assert cfg.arch is Arch.SM90A and arch == "sm90a"
    assert cfg.head_dim == int(d[1:])
    assert cfg.dtype is DType(dt)
    assert cfg.schedule is {"coop": Schedule.COOPERATIVE, "pp": Schedule.PINGPONG,
                            "single": Schedule.SINGLE, "dual": Schedule.DUAL, "dual3": Schedule.DUAL}[sched]
    assert cfg.streams == (3 if sched == "dual3" else 2)
    assert f"t{cfg.tile_m}x{cfg.tile_n}" == tiles and f"s{cfg.stages}" == stages
    assert f"b{cfg.block_m}x{cfg.block_n}" == blocks
    assert 2 <= cfg.stages <= 16  # tuned per head dim; the shared-memory budget below is the rule
    facts = Arch.SM90A.facts
    assert cfg.smem_bytes() <= facts.smem_optin
    assert cfg.ctas_per_sm * (cfg.smem_bytes() + 1024) <= facts.smem_per_sm


def test_named_config_names_are_unique_kernels():
    configs = load_named_configs()
    names = [c.kernel_name for c in configs.values()]
    assert len(set(names)) == len(names)
    assert config_names() == sorted(configs)


def test_canonical_json_is_stable():
    cfg = AttentionConfig()
    assert cfg.to_json() == (
        '{"arch":"SM90A","block_m":128,"block_n":128,"dtype":"FP16","family":"attn_fwd","head_dim":128,'
        '"schedule":"COOPERATIVE","stages":4,"tile_m":128,"tile_n":128}')
    # enums by name, sorted keys, whatever spelling built it
    same = AttentionConfig(dtype="fp16", schedule="COOPERATIVE", arch="sm90a")
    assert same.to_json() == cfg.to_json()
    assert same == cfg


def test_kernel_name_is_pinned():
    # Changing these names invalidates every cache and every profile label: do it on purpose only.
    cfg = AttentionConfig(head_dim=128, dtype="fp16", schedule="cooperative", stages=4)
    assert cfg.kernel_name == "bsk_sm90a_attn_fwd_d128_fp16_t128x128_coop_s4_b128x128_4ebe6156fb1c"
    cfg = AttentionConfig(head_dim=64, dtype="bf16", schedule="pingpong", stages=6)
    assert cfg.kernel_name == "bsk_sm90a_attn_fwd_d64_bf16_t128x128_pp_s6_b128x128_8023a12d03a9"
    assert cfg.kernel_name.endswith(cfg.config_hash[:12])


def test_round_trip_json_and_dict():
    for cfg in load_named_configs().values():
        assert KernelConfig.from_json(cfg.to_json()) == cfg
        assert type(cfg).from_dict(cfg.to_dict()) == cfg
        assert json.loads(cfg.to_json())["family"] == cfg.family


@pytest.mark.parametrize("changes, reason", [
    (dict(head_dim=96), "head_dim 96"),
    (dict(tile_m=64), "tile_m 64"),
    (dict(tile_n=256), "tile_n 256"),
    (dict(stages=1), "stages 1"),
    (dict(stages=8), "shared memory"),
    (dict(block_m=192), "block_m 192"),
    (dict(block_n=100), "block_n 100"),
    (dict(arch="sm100a"), "sm100a"),
    (dict(head_dim=256, tile_n=128, stages=2), "accumulator registers"),
    (dict(head_dim=64, schedule="single"), "tile_m 128 != 64"),
    (dict(head_dim=64, schedule="single", tile_m=64, stages=5), "even count"),
    (dict(head_dim=64, schedule="single", tile_m=64, stages=8), "with 2 per SM"),
    (dict(head_dim=64, schedule="pingpong", tile_m=64), "schedule='single'"),
])
def test_invalid_configs_rejected_with_reason_and_nearest(changes, reason):
    cfg = dataclasses.replace(AttentionConfig(), **changes)
    with pytest.raises(InvalidConfigError) as ei:
        cfg.validate()
    msg = str(ei.value)
    assert reason in msg
    assert "nearest valid config:" in msg
    near_json = msg.split("nearest valid config:", 1)[1].strip()
    near = KernelConfig.from_json(near_json)
    assert near.problems() == []


def test_bad_field_types_and_names_rejected():
    with pytest.raises(InvalidConfigError, match="head_dim must be an int"):
        AttentionConfig(head_dim="128")
    with pytest.raises(InvalidConfigError, match="DType must be one of"):
        AttentionConfig(dtype="fp8")
    with pytest.raises(InvalidConfigError, match="unknown attn_fwd config field"):
        AttentionConfig.from_dict({"head_dim": 64, "heads": 8})
    with pytest.raises(InvalidConfigError, match="not valid JSON"):
        KernelConfig.from_json("{nope")


def test_resolve_config_forms(tmp_path):
    named = get_config("bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128")
    assert resolve_config("bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128") == named
    assert resolve_config(named.to_json()) == named
    mine = AttentionConfig(head_dim=64, stages=6)
    assert resolve_config('{"head_dim": 64, "stages": 6}') == mine  # family defaults to attention forward
    assert resolve_config({"head_dim": 64, "stages": 6}) == mine
    f = tmp_path / "mine.json"
    f.write_text(named.to_json())
    assert resolve_config(str(f)) == named
    assert load_config_file(f) == named


def test_resolve_config_errors(tmp_path):
    with pytest.raises(InvalidConfigError, match="did you mean bsk_sm90a_attn_fwd_d128_fp16_t128x128_coop_s5_b128x128"):
        resolve_config("bsk_sm90a_attn_fwd_d128_fp16_t128x128_cop_s5_b128x128")
    with pytest.raises(InvalidConfigError, match="does not exist"):
        resolve_config(str(tmp_path / "missing.json"))
    with pytest.raises(InvalidConfigError, match="head_dim 80"):
        resolve_config('{"head_dim": 80}')
    bad = tmp_path / "bad.json"
    bad.write_text('{"family": "attn_fwd", "tile_n": 32}')
    with pytest.raises(InvalidConfigError, match=r"bad\.json"):
        resolve_config(str(bad))
    with pytest.raises(InvalidConfigError):
        get_config("../pyproject")


def test_unservable_layout_blocks_raise_instead_of_running_a_wrong_kernel():
    import torch
    from blackwell_sparsek.layout import BlockSparseLayout as L
    from blackwell_sparsek.ops import default_config
    with pytest.raises(InvalidConfigError, match="block_m must be a multiple of 64"):
        default_config(128, torch.float16, L.dense(1000, block_m=32, block_n=64))
    with pytest.raises(InvalidConfigError, match="at head_dim 256"):  # its single-warpgroup tiles do not fit
        default_config(256, torch.float16, L.dense(1000, block_m=64, block_n=64))
    cfg = default_config(128, torch.float16, L.dense(1000, block_m=128, block_n=64))
    assert (cfg.block_m, cfg.block_n, cfg.tile_n) == (128, 64, 64)
    # 64-row blocks: the dual kernel (64-row streams per CTA: three at D=64 with 64-key tiles), 128-key tiles only
    # where they fit; the single-warpgroup kernel on request
    for d, bn, tn, streams in ((64, 128, 128, 2), (64, 64, 64, 3), (128, 128, 64, 2), (128, 64, 64, 2)):
        lay = L.dense(1000, block_m=64, block_n=bn)
        cfg = default_config(d, torch.float16, lay)
        assert (cfg.schedule, cfg.tile_m, cfg.tile_n, cfg.block_m) == (Schedule.DUAL, 64, tn, 64)
        assert cfg.streams == streams
        assert cfg.problems() == [] and cfg.smem_bytes() <= Arch.SM90A.facts.smem_optin
        cfg = default_config(d, torch.float16, lay, schedule="single")
        assert (cfg.schedule, cfg.tile_m, cfg.block_m) == (Schedule.SINGLE, 64, 64) and cfg.problems() == []


def test_q_slots_by_schedule_and_head_dim():
    # ping-pong at D=64 keeps two Q slots a warpgroup (a warpgroup's next row's Q loads during this one: its shared
    # memory is spare), one elsewhere (at D=128 a second would cost a K/V stage); the O staging is one 64-row
    # buffer a warpgroup either way
    pp64 = AttentionConfig(head_dim=64, schedule="pingpong", stages=8)
    assert pp64.q_stages == 4 and pp64.problems() == []
    assert pp64.smem_bytes() == 4 * 8192 + 8 * 16384 + 2 * 8192 + 1024
    assert AttentionConfig(head_dim=128, schedule="pingpong", stages=5).q_stages == 2
    assert AttentionConfig(head_dim=64, schedule="cooperative", stages=8).q_stages == 2
    # the default D=128 ping-pong ring still fits beside its two Q slots and O staging
    assert AttentionConfig(head_dim=128, schedule="pingpong", stages=5).smem_bytes() <= Arch.SM90A.facts.smem_optin


def test_claims_field_and_rule():
    # claims: the ping-pong CTAs' tile order; left out (None) it is the default (claims at D=128 and split-KV),
    # and a value equal to the default is stored as None, so one kernel has one name and one JSON
    import torch
    from blackwell_sparsek.layout import BlockSparseLayout as L
    from blackwell_sparsek.ops import default_config
    from blackwell_sparsek.ops import dispatch
    c64 = AttentionConfig(head_dim=64, schedule="pingpong", stages=8, claims=True)
    assert c64.claims_tiles and c64.kernel_name.endswith(c64.config_hash[:12]) and "_claims_" in c64.kernel_name
    assert AttentionConfig.from_json(c64.to_json()) == c64 and '"claims":true' in c64.to_json()
    plain = AttentionConfig(head_dim=64, schedule="pingpong", stages=8, claims=False)
    assert plain == AttentionConfig(head_dim=64, schedule="pingpong", stages=8) and "claims" not in plain.to_json()
    assert not plain.claims_tiles
    static128 = AttentionConfig(head_dim=128, schedule="pingpong", stages=5, claims=False)
    assert not static128.claims_tiles and "_static_" in static128.kernel_name and static128.problems() == []
    assert AttentionConfig(head_dim=128, schedule="pingpong", stages=5, claims=True).claims is None
    with pytest.raises(InvalidConfigError, match="persistent ping-pong"):
        AttentionConfig(head_dim=64, schedule="cooperative", stages=8, claims=True).validate()
    with pytest.raises(InvalidConfigError, match="claims must be"):
        AttentionConfig(head_dim=64, schedule="pingpong", stages=8, claims=1).validate()
    # the rule: D=64 ping-pong claims where row lengths vary (cv > CLAIM_CV_D64), keeps the static order on
    # uniform rows; D=128 claims everywhere (its default)
    window, topk = L.sliding_window(4096, 1024), L.random_topk(4096, 8, seed=1)
    assert window.row_stats()[1] > dispatch.CLAIM_CV_D64 >= topk.row_stats()[1]
    assert default_config(64, torch.float16, window).claims_tiles
    assert not default_config(64, torch.bfloat16, topk).claims_tiles
    assert not default_config(64, torch.float16, L.dense(4096)).claims_tiles
    assert default_config(128, torch.float16, topk).claims_tiles
    # a named config with claims set is never the one the dispatch derives for a layout without that choice
    assert default_config(64, torch.float16, topk).claims is None


def test_dual_streams_rules():
    # streams: 2 or 3, dual schedule only; the third stream leaves 160 registers a thread (96 for accumulators:
    # head_dim 64 with 64-key tiles) and a third of the shared memory; the field stays out of the canonical form
    # (name, JSON) at its default
    base = dict(schedule="dual", head_dim=64, tile_n=64, block_m=64, block_n=64, stages=7)
    cfg = AttentionConfig(**base, streams=3)
    assert cfg.problems() == [] and "dual3_s7" in cfg.kernel_name and cfg.to_dict()["streams"] == 3
    assert cfg.smem_bytes() == 3 * (8192 + 7 * 8192 + 8192) + 1024
    two = AttentionConfig(**base)
    assert "streams" not in two.to_dict() and "_dual_s7" in two.kernel_name
    assert AttentionConfig.from_json(cfg.to_json()) == cfg
    # the setmaxnreg split is the config's (rendered into the dual shell, which asserts it fits the register file)
    assert (cfg.mma_registers, two.mma_registers, AttentionConfig().mma_registers) == (160, 240, 240)
    src = render(cfg)
    assert "/*Streams=*/3, /*MmaRegisters=*/160, /*LoadRegisters=*/24>" in src
    assert "/*Streams=*/2, /*MmaRegisters=*/240, /*LoadRegisters=*/24>" in render(two)
    for bad, match in ((dict(streams=4), "streams 4 is not supported; use 2 or 3"),
                       (dict(streams=1), "use 2 or 3"),
                       (dict(streams=3, stages=8), "shared memory"),
                       (dict(streams=3, tile_n=128, block_n=128), "budget 96 with 3 streams"),
                       (dict(streams=3, head_dim=128), "budget 96 with 3 streams.*use streams=2")):
        with pytest.raises(InvalidConfigError, match=match):
            AttentionConfig(**(base | bad)).validate()
    with pytest.raises(InvalidConfigError, match="dual schedule only"):
        AttentionConfig(schedule="pingpong", streams=3).validate()
    with pytest.raises(InvalidConfigError, match="streams must be an int"):
        AttentionConfig(**base, streams="3")
    # nearest_valid keeps three streams where they fit and falls back to two where they cannot
    assert AttentionConfig(**(base | dict(stages=9)), streams=3).nearest_valid().streams == 3
    near = AttentionConfig(**(base | dict(head_dim=128, stages=3)), streams=3).nearest_valid()
    assert near is not None and near.streams == 2 and near.problems() == []


def test_dual_variant_for_the_benches():
    import torch
    from blackwell_sparsek.layout import BlockSparseLayout as L
    from blackwell_sparsek.ops import default_config
    from blackwell_sparsek.ops.dispatch import dual_variant
    b64, b128 = L.dense(1000, block_m=64, block_n=64), L.dense(1000)
    three = default_config(64, torch.float16, b64)
    two = dual_variant(three, 2, 8)
    assert (two.streams, two.stages, two.tile_n) == (2, 8, 64) and two.problems() == []
    assert dual_variant(two, 3) == three  # the deepest ring that fits: the default's 7 stages
    on128 = dual_variant(default_config(64, torch.float16, b128, schedule="dual"), 3)
    assert (on128.streams, on128.tile_n, on128.stages, on128.block_m) == (3, 64, 7, 128)
    with pytest.raises(InvalidConfigError, match="no dual config with 3 streams"):
        dual_variant(default_config(128, torch.float16, b64), 3)
    with pytest.raises(InvalidConfigError, match="and 9 stages"):
        dual_variant(three, 3, 9)


def test_default_schedule_follows_row_stats():
    """The rule fitted to the schedule sweep (bench/results/<gpu>/schedules.json, an H100 and an H200): per mask
    family, length and head dim, the schedule that was faster (or within 1.5 % of it) in the same runs on both."""
    import torch
    from blackwell_sparsek.layout import BlockSparseLayout as L
    from blackwell_sparsek.bench.schedules import masks
    from blackwell_sparsek.ops import default_config
    P, C = Schedule.PINGPONG, Schedule.COOPERATIVE
    want = {  # mask: (D=64, D=128) at 8K, then at 32K tokens
        8192: {"dense": (P, P), "causal": (C, P), "topk25-shared": (P, P), "topk25-per-head": (P, P),
               "window2K": (P, P), "documents": (P, P),
               # BigBird's global rows make its layout split-KV (split_plan): ping-pong, whose CTAs claim tiles
               "bigbird": (P, P), "bigbird-noglobal": (P, P), "varlen25": (P, P), "varlen-short": (P, P)},
        # causal at D=64: cooperative 3-6 % ahead at 4K-16K (batch 2), a tie at 32K; at D=128 ping-pong CTAs
        # claim their tiles and lead or tie on causal rows of every length (h100/claims.txt section 5)
        32768: {"dense": (P, P), "causal": (C, P), "topk25-shared": (P, P), "topk25-per-head": (P, P),
                "window2K": (P, P), "documents": (P, P), "bigbird": (P, P), "bigbird-noglobal": (P, P),
                "varlen25": (P, P), "varlen-short": (P, P)},
    }
    for s, fams in want.items():
        got = masks(s, 16)
        assert set(got) == set(fams)
        for name, lay in got.items():
            for d, w in zip((64, 128), fams[name]):
                assert default_config(d, torch.float16, lay).schedule is w, (s, name, d, lay.row_stats())
            assert default_config(256, torch.float16, lay).schedule is C
    # short dense rows at D=64 (16 blocks) stay ping-pong, like top-k rows of that length; so do short causal
    # rows (1K-2K tokens: 9-18 % faster ping-pong), while causal rows of 16+ blocks on average go cooperative
    assert default_config(64, torch.float16, L.dense(2048)).schedule is P
    for s, w in ((1024, P), (2048, P), (4096, C)):
        assert default_config(64, torch.float16, masks(s, 16)["causal"]).schedule is w, s
        assert default_config(128, torch.float16, masks(s, 16)["causal"]).schedule is P, s


# -- issue 24: every integer field bounded (item 12), tile_m from the schedule (item 23) ------------------------

@pytest.mark.parametrize("field, value", [
    (f, v) for f in ("head_dim", "tile_m", "tile_n", "stages", "block_m", "block_n")
    for v in (0, -64, 100_000_000_000)
] + [("block_m", 8192), ("block_n", 4096 + 128), ("block_m", 192), ("head_dim", 512), ("stages", 17)])
def test_every_integer_field_is_bounded(field, value):
    """Out-of-range integers are rejected before nvcc (block_n=1e11 used to pass and fail in nvcc), never with a
    ZeroDivisionError (tile_m/tile_n 0), and the nearest valid config is still offered."""
    cfg = AttentionConfig(**{field: value})
    probs = cfg.problems()
    assert probs and any(f"{field} {value}" in p for p in probs), probs
    with pytest.raises(InvalidConfigError, match="nearest valid config") as ei:
        resolve_config({field: value})
    near = KernelConfig.from_json(str(ei.value).split("nearest valid config:", 1)[1].strip())
    assert near.problems() == []
    assert max(near.block_m, near.block_n) <= 4096


def test_block_size_limits():
    from blackwell_sparsek.families.attn_fwd import MAX_BLOCK
    assert MAX_BLOCK == 4096
    assert AttentionConfig(block_m=4096, block_n=4096).problems() == []
    assert AttentionConfig(head_dim=64, schedule="single", block_m=64, block_n=128).problems() == []
    # the nearest valid block rounds up to the kernel's own tile (64 rows for the single schedule)
    near = AttentionConfig(head_dim=64, schedule="single", block_m=100, block_n=100).nearest_valid()
    assert (near.block_m, near.block_n) == (128, 128) and near.problems() == []
    near = AttentionConfig(block_m=10**12, block_n=-5).nearest_valid()
    assert (near.block_m, near.block_n) == (4096, 128)


def test_tile_m_follows_the_schedule():
    single = AttentionConfig(head_dim=64, schedule="single")
    assert single.tile_m == 64 and single.problems() == []
    assert single == AttentionConfig(head_dim=64, schedule="single", tile_m=64)  # same identity, same kernel
    assert AttentionConfig(schedule="pingpong").tile_m == 128 and AttentionConfig().tile_m == 128
    assert resolve_config('{"schedule": "single", "head_dim": 64}') == single
    assert resolve_config({"schedule": "single", "head_dim": 64}).kernel_name == single.kernel_name
    assert get_config("bsk_sm90a_attn_fwd_d64_fp16_t64x128_single_s4_b128x128").tile_m == 64
    # an explicit tile_m that contradicts the schedule still errors, naming the fix
    with pytest.raises(InvalidConfigError, match="set tile_m=64 or leave tile_m out") as ei:
        resolve_config({"schedule": "single", "head_dim": 64, "tile_m": 128})
    assert '"tile_m":64' in str(ei.value).split("nearest valid config:", 1)[1]


# -- issue 24 item 9: config files; item 13: what resolve_config accepts ---------------------------------------

def test_config_file_without_family_is_attention_forward(tmp_path):
    f = tmp_path / "mine.json"
    f.write_text('{"head_dim": 64, "stages": 6}')
    assert resolve_config(str(f)) == AttentionConfig(head_dim=64, stages=6)  # like inline JSON and dicts
    assert load_config_file(f) == AttentionConfig(head_dim=64, stages=6)
    f.write_bytes(b"\xef\xbb\xbf" + b'{"head_dim": 64}')  # a BOM some editors write
    assert resolve_config(f) == AttentionConfig(head_dim=64)  # a Path works too


@pytest.mark.parametrize("content, match", [
    (b'\xff\xfe{"head_dim": 64}', r"not UTF-8 text \(byte 0xff at offset 0\); save it as UTF-8"),
    (b"[]", "must be a JSON object of config fields.*got an array"),
    (b'"bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128"', "got a string"),
    (b"{nope", "not valid JSON"),
    (b"[" * 200_000, "nested too deeply"),
    (b'{"family": ["attn_fwd"]}', "'family' must be a string"),
    (b'{"family": "attn_nope"}', "unknown kernel family 'attn_nope'"),
    (b" " * (1 << 20) + b"{}", "over 1048576 bytes"),
], ids=["not-utf8", "array", "string", "bad-json", "deep-nesting", "family-list", "unknown-family", "huge"])
def test_bad_config_files_are_typed_errors(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_bytes(content)
    with pytest.raises(InvalidConfigError, match=match) as ei:
        resolve_config(str(f))
    assert str(f) in str(ei.value)


def test_config_paths_that_are_not_files(tmp_path):
    d = tmp_path / "x.json"
    d.mkdir()
    with pytest.raises(InvalidConfigError, match="is a directory"):
        resolve_config(str(d))
    with pytest.raises(InvalidConfigError, match="is a directory"):
        load_config_file(tmp_path)
    import os
    if os.path.exists("/dev/null"):  # a device (or FIFO) is never read: /dev/zero would never end
        with pytest.raises(InvalidConfigError, match="not a regular file"):
            resolve_config("/dev/null")
    with pytest.raises(InvalidConfigError, match="does not exist"):
        resolve_config(str(tmp_path / "no" / "such.json"))
    with pytest.raises(InvalidConfigError, match="no named config"):
        resolve_config("x" * 5000)  # used to be OSError: File name too long
    with pytest.raises(InvalidConfigError, match="no named config"):
        resolve_config("a\0b")


@pytest.mark.parametrize("spec", [5, None, 1.5, b"bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128", ["head_dim", 64], object()])
def test_resolve_config_rejects_other_types_with_a_type_error(spec):
    from blackwell_sparsek.jit.spec import ConfigTypeError
    with pytest.raises(ConfigTypeError, match="a dict of config fields, inline JSON text.*named config") as ei:
        resolve_config(spec)
    assert isinstance(ei.value, TypeError) and isinstance(ei.value, InvalidConfigError)


def test_from_dict_rejects_non_objects():
    with pytest.raises(InvalidConfigError, match="must be a JSON object"):
        KernelConfig.from_json("[]")
    with pytest.raises(InvalidConfigError, match="must be a JSON object"):
        KernelConfig.from_dict([("family", "attn_fwd")])
    with pytest.raises(InvalidConfigError, match="unknown attn_fwd config field"):
        resolve_config({1: 2, "x": 3})  # keys of mixed types are reported, not a TypeError from sorting


def test_named_config_file_is_its_kernel_name_without_the_hash():
    """One naming scheme: cutlass_configs/<name>.json holds the config whose kernel is <name>_<hash12>."""
    for name, cfg in load_named_configs().items():
        assert cfg.config_name == name, (name, cfg.kernel_name)
        assert cfg.kernel_name == f"{name}_{cfg.config_hash[:12]}"
