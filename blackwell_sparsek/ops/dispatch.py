"""The one place choices are made for an op: which config serves these inputs and this layout (named config or
derived, the default schedule), whether it can run on the device, what a traced call bakes in.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import torch

from ..errors import InvalidConfigError, ToolchainError
from ..families.attn_fwd import AttentionConfig, Schedule
from ..jit.spec import DType, KernelConfig
from ._checks import DTYPES as _DTYPES, as_dtype, check_head_dim, check_layout_arg

# Stages of the K/V ring by head dim: as deep as the shared memory allows (see AttentionConfig.smem_bytes).
_DEFAULT_STAGES = {64: 8, 128: 5, 256: 4}
# The dual schedule's streams and K/V ring per stream, by (head_dim, tile_n): that many rings, Q slots and O
# buffers in one CTA. Three streams at head_dim 64 with 64-key tiles (64x64 blocks, 25 %: +12 % over two on H100
# and H200, bench/results/*/blocks64.txt); 64x128 blocks keep two streams of 128-key tiles (three of 64-key tiles
# tie or lose).
_DUAL = {(64, 64): (3, 7), (64, 128): (2, 6), (128, 64): (2, 5)}
# When one CTA per tile in heaviest-first order (cooperative: the hardware hands tiles to free SMs) beats
# persistent ping-pong CTAs, from layout.row_stats() = (mean blocks per row, coefficient of variation, fraction of
# rows shorter than the longest). Fitted to same-run measurements of both schedules over ten mask families at 8K
# and 32K tokens, D=64 and 128, and causal rows from 1K to 32K tokens, on two H100s and an H200
# (python -m blackwell_sparsek.bench.schedules, bench/results/<gpu>/schedules.json, h100/claims.txt section 5).
# At D=64 ping-pong CTAs take their tiles in a static round-robin, and rows whose lengths spread widely (causal:
# cv 0.57) go cooperative; short rows stay ping-pong even when their lengths vary (a CTA per short row pays its
# prologue on few blocks: causal at 1K-2K tokens runs 9-18 % faster ping-pong). At D=128 ping-pong CTAs claim
# their tiles at run time (AttentionConfig.claims_tiles), which evens out rows of varied length: ping-pong
# everywhere (causal rows of 1K-32K tokens: ahead or within 4 % on both GPUs).
SPREAD_CV = 0.45
SHORT_ROWS_D64 = 16
# Ping-pong at D=64 claims its tiles (AttentionConfig.claims) where row lengths vary this much: a static
# round-robin leaves SMs idle behind long rows (learned-length rows +3-4.5 %, windows up to +2 %), while on
# uniform rows the claim costs 1-4 % and on nearly uniform ones (cv 0.14-0.15) 0.8 % (H200, same process,
# bench/results/h200/claims64.txt).
CLAIM_CV_D64 = 0.25


def default_schedule(head_dim: int, block_m: int, stats: tuple[float, float, float], split: bool = False
                     ) -> Schedule:
    """The schedule sparse_attention picks: for 64-row blocks the dual kernel (two or three MMA warpgroups, each
    on its own 64-row block) up to head_dim 128, the single-warpgroup one at 256 (the dual kernel's two K/V rings
    do not fit); cooperative at head_dim 256 and where the rows' statistics say so (above), ping-pong otherwise.
    ``split``: the layout runs split-KV: ping-pong, whose persistent CTAs claim the pieces and rows at run time
    (H200, bench.split_kv, same run: global rows at 32K 572 against cooperative's 529 effective TFLOPS at D=128,
    417 against 363 at D=64; BigBird at 8K 586 against 552, 427 against 391)."""
    if block_m % 128:
        return Schedule.DUAL if head_dim <= 128 else Schedule.SINGLE
    mean, cv, _ = stats
    if head_dim > 128:
        return Schedule.COOPERATIVE
    if split:
        return Schedule.PINGPONG
    if head_dim < 128 and cv > SPREAD_CV and mean >= SHORT_ROWS_D64:
        return Schedule.COOPERATIVE
    return Schedule.PINGPONG


# -- config choice ------------------------------------------------------------------------------------------

def default_config(head_dim: int, dtype: torch.dtype | DType | str, layout=None, schedule: Schedule | None = None
                   ) -> AttentionConfig:
    """The config sparse_attention uses when none is given: a named config if one matches, else a derived one.
    head_dim must be 64, 128 or 256 (InputError otherwise, before anything is built)."""
    check_head_dim(head_dim)
    dt = as_dtype(dtype)
    if layout is not None:
        check_layout_arg(layout)
    if schedule is not None and not isinstance(schedule, Schedule):
        schedule = _as_schedule(schedule)
    if layout is None:
        return _config_for(head_dim, dt, 128, 128, (0.0, 0.0, 0.0), schedule)
    return _config_for(head_dim, dt, layout.block_m, layout.block_n, layout.row_stats(), schedule,
                       layout.split_plan())


def _config_for(head_dim: int, dt: DType, bm: int, bn: int, stats: tuple[float, float, float],
                schedule: Schedule | None, split: tuple[int, int] | None = None
                ) -> AttentionConfig:
    """The default config; split-KV (layout.split_plan(): a few rows far longer than the rest) on the schedules
    that take it (128-row tiles), so a long row runs as pieces on many SMs instead of one CTA's serial loop."""
    if schedule is None:
        schedule = default_schedule(head_dim, bm, stats, split is not None)
    cfg = _derived_config(head_dim, dt, bm, bn, schedule)
    if split is not None and cfg.schedule in SPLIT_SCHEDULES:
        cfg = _with(cfg, "split_kv")
    elif cfg.schedule is Schedule.PINGPONG and head_dim == 64 and stats[1] > CLAIM_CV_D64:
        cfg = _with(cfg, "claims")
    return cfg


SPLIT_SCHEDULES = (Schedule.COOPERATIVE, Schedule.PINGPONG)


@lru_cache(maxsize=None)
def _with(cfg: AttentionConfig, field: str) -> AttentionConfig:
    """cfg with one boolean field (split_kv, claims) set, validated once per config."""
    return dataclasses.replace(cfg, **{field: True}).validate()


@torch.compiler.assume_constant_result
def is_split(config_json: str) -> bool:
    """Whether the config (JSON) runs split-KV (the attn_fwd_split op); a trace-time constant under torch.compile
    (dynamo cannot trace the JSON parse)."""
    return _is_split(config_json)


@lru_cache(maxsize=None)
def _is_split(config_json: str) -> bool:
    return bool(getattr(config_from_json(config_json), "split_kv", False))


def _as_schedule(schedule) -> Schedule:
    for s in Schedule:
        if isinstance(schedule, str) and schedule.lower() in (s.value, s.name.lower()):
            return s
    raise InvalidConfigError(f"schedule must be one of {[s.value for s in Schedule]} (or a Schedule), "
                             f"got {schedule!r}")


@lru_cache(maxsize=None)
def _derived_config(head_dim: int, dt: DType, bm: int, bn: int, schedule: Schedule) -> AttentionConfig:
    from ..jit.spec import load_named_configs
    for cfg in load_named_configs().values():
        if (isinstance(cfg, AttentionConfig) and cfg.head_dim == head_dim and cfg.dtype is dt and cfg.block_m == bm
                and cfg.block_n == bn and cfg.schedule is schedule and cfg.claims is None):
            return cfg
    single = schedule is Schedule.SINGLE
    # one 64-row warpgroup per CTA, 2-3 CTAs per SM: 128-key tiles fit the shared memory only at head_dim 64
    # (likewise two K/V rings in one CTA for the dual schedule)
    tile_n = 128 if bn % 128 == 0 and head_dim <= (64 if single or schedule is Schedule.DUAL else 128) else 64
    stages = 4 if single else _DEFAULT_STAGES.get(head_dim, 2)
    streams = 2
    if schedule is Schedule.DUAL:
        streams, stages = _DUAL.get((head_dim, tile_n), (2, 2))
    cfg = AttentionConfig(head_dim=head_dim, dtype=dt, schedule=schedule, tile_m=schedule.tile_m,
                          tile_n=tile_n, stages=stages, block_m=bm, block_n=bn, streams=streams)
    if cfg.problems():
        near = cfg.nearest_valid()
        if near is None or (near.block_m, near.block_n) != (bm, bn):
            raise InvalidConfigError(
                f"no sm90a attention kernel serves {bm}x{bn} layout blocks at head_dim {head_dim}: block_m must be "
                f"a multiple of 64 (128 for the two-warpgroup kernels) and block_n a multiple of 64; build the "
                f"layout with block_m=128, block_n=128 (reasons: {'; '.join(cfg.problems())})")
        cfg = near
    return cfg


def dual_variant(cfg: AttentionConfig, streams: int, stages: int | None = None) -> AttentionConfig:
    """``cfg`` (a dual-schedule config) with ``streams`` streams, for the benches that time the count the default
    did not pick: three take 64-key tiles; the ring ``stages`` deep, or as deep as the shared memory allows."""
    want = dataclasses.replace(cfg, streams=streams, tile_n=64 if streams == 3 else cfg.tile_n, stages=stages or 16)
    got = want.nearest_valid()
    if got is None or got.streams != streams or (stages and got.stages != stages):
        raise InvalidConfigError(f"no dual config with {streams} streams{f' and {stages} stages' if stages else ''} "
                                 f"near {cfg.to_json()}: {'; '.join(want.problems())}")
    return got


@lru_cache(maxsize=None)
def validated(config: AttentionConfig) -> AttentionConfig:
    return config.validate()


@lru_cache(maxsize=None)
def json_of(config: AttentionConfig) -> str:
    return config.to_json()


def resolve_config(config, head_dim: int, dtype: torch.dtype, layout) -> AttentionConfig:
    """The config for these inputs (already checked) and layout (or its geometry under tracing), checked against
    them: a named config, a Schedule, an AttentionConfig or None (the default)."""
    if isinstance(config, str):
        from ..jit.spec import get_config
        config = get_config(config)
    if config is None or isinstance(config, Schedule):
        return _config_for(head_dim, _DTYPES[dtype], layout.block_m, layout.block_n, layout.row_stats(), config,
                           layout.split_plan())
    if not isinstance(config, AttentionConfig):
        raise InvalidConfigError(f"config must be an AttentionConfig, a named config or a Schedule, "
                                 f"not {type(config).__name__}")
    validated(config)
    want = _DTYPES[dtype]
    if config.head_dim != head_dim or config.dtype is not want:
        raise InvalidConfigError(
            f"config {config.kernel_name} is for head_dim={config.head_dim}, dtype={config.dtype.value}; the inputs "
            f"have head_dim={head_dim}, dtype={want.value}: pass config=None or a matching config")
    if (config.block_m, config.block_n) != (layout.block_m, layout.block_n):
        raise InvalidConfigError(
            f"config {config.kernel_name} serves {config.block_m}x{config.block_n} blocks but the layout has "
            f"{layout.block_m}x{layout.block_n}: use dataclasses.replace(config, block_m={layout.block_m}, "
            f"block_n={layout.block_n}) or config=None")
    if config.split_kv and layout.split_plan() is None:
        raise InvalidConfigError(
            f"config {config.kernel_name} runs split-KV but the layout's rows are not skewed enough to split "
            f"(layout.split_plan() is None): use dataclasses.replace(config, split_kv=False) or config=None")
    return config


@lru_cache(maxsize=None)
def config_from_json(text: str) -> KernelConfig:
    return KernelConfig.from_json(text)


@lru_cache(maxsize=None)
def device_facts(device_index: int | None):
    """runtime.device_info of a CUDA device (None: the current one), once per device: name, compute capability,
    SM count, opt-in shared memory."""
    from ..jit.runtime import device_info
    return device_info(device_index if device_index is not None else torch.cuda.current_device())


def sm_count(device_index: int | None) -> int:
    return device_facts(device_index).sm_count


@lru_cache(maxsize=None)
def check_device(config_text: str, device_index: int) -> None:
    """Once per (config, device): the kernel's arch matches the device and its shared memory fits (a typed
    InvalidConfigError naming both otherwise) before the first launch there."""
    from ..jit.runtime import check_device as _check
    _check(config_from_json(config_text), device_index)


def config_json_traced(config, head_dim, dtype, block_m, block_n, stats, split=None) -> str:
    """The kernel config as JSON while dynamo traces. A bad config raises the eager path's InvalidConfigError from
    traced code (an exception escaping an assume_constant_result function would surface as an internal dynamo
    error instead)."""
    cfg_json, error = _config_json_const(config, head_dim, dtype, block_m, block_n, stats, split)
    if error:
        raise InvalidConfigError(error)
    return cfg_json


@torch.compiler.assume_constant_result
def _config_json_const(config, head_dim, dtype, block_m, block_n, stats, split) -> tuple[str, str]:
    """(config JSON, "") or ("", the InvalidConfigError's message), computed once at trace time from plain values
    (a torch.compile constant)."""
    class _Geom:  # just what _resolve_config reads of a layout
        pass
    g = _Geom()
    g.block_m, g.block_n = block_m, block_n
    g.row_stats = lambda: stats
    g.split_plan = lambda: split
    try:
        return json_of(resolve_config(config, head_dim, dtype, g)), ""
    except InvalidConfigError as e:
        return "", str(e)


def check_backward_config(cfg_json: str, deterministic: int) -> None:
    """Before a forward whose inputs need gradients: InvalidConfigError (naming the fix) when no backward kernel
    serves the forward's config (head_dim 256, key blocks not a multiple of 128), rather than after the forward
    ran. Every path checks it, the CPU fallback and torch.compile included."""
    error = _backward_problem(cfg_json, deterministic == 1)
    if error:
        raise InvalidConfigError(error)


@torch.compiler.assume_constant_result
def _backward_problem(cfg_json: str, deterministic: bool) -> str:
    """"" or the InvalidConfigError's message (a torch.compile constant, as _config_json_const)."""
    from .attention_bwd import bwd_config_json
    try:
        bwd_config_json(cfg_json, deterministic)
        return ""
    except InvalidConfigError as e:
        return str(e)


@lru_cache(maxsize=None)
def kernel_available(cfg: AttentionConfig) -> bool:
    """True when the kernel is cached or can be compiled here (so a missing nvcc can fall back)."""
    from ..jit.kernels import build
    try:
        build(cfg)
    except ToolchainError:
        return False
    return True
