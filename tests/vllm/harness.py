"""Drive a real vLLM V1 scheduler offline, as vLLM's own `tests/v1/core/utils.py` does.

No model runs: the test plays the model runner, giving every request that finished its prompt
one sampled token per step. Imported only by test modules that have already checked that vLLM
is installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

if TYPE_CHECKING:
    from pathlib import Path

BLOCK_SIZE = 16
SAMPLED_TOKEN = 7


def build_scheduler(
    cls: type[Any],
    model_dir: Path,
    *,
    max_num_batched_tokens: int = 64,
    max_num_seqs: int = 8,
    num_blocks: int = 1000,
    max_model_len: int = 1024,
    **kwargs: Any,
) -> Any:
    """A scheduler of class `cls` over a hand-made KV cache of `num_blocks` blocks.

    `max_model_len` must not exceed the model config's `max_position_embeddings`."""
    model_config = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
    vllm_config = VllmConfig(
        model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config
    )
    cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        log_stats=True,
        block_size=BLOCK_SIZE,
        **kwargs,
    )


def make_request(
    request_id: str, prompt_tokens: int, *, max_tokens: int = 50, arrival_time: float | None = None
) -> Request:
    """A request with a prompt of `prompt_tokens` tokens (its id's hash picks the token),
    arriving at `arrival_time` (seconds; default now, on the wall clock, as vLLM's own)."""
    token = 3 + sum(map(ord, request_id)) % 200
    return Request(
        request_id=request_id,
        prompt_token_ids=[token] * prompt_tokens,
        sampling_params=SamplingParams(max_tokens=max_tokens),
        pooling_params=None,
        arrival_time=arrival_time,
    )


@dataclass(slots=True)
class Step:
    """What one scheduling step did: tokens scheduled, requests admitted from the waiting
    queues (new ones, then preempted ones resumed), tokens produced."""

    scheduled: dict[str, int]
    admitted: list[str]
    produced: dict[str, list[int]] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    #: Each finished request's (finish_reason, stop_reason) as the API server receives them.
    reasons: dict[str, tuple[str, Any]] = field(default_factory=dict)


def run_step(scheduler: Any, *args: Any, **kwargs: Any) -> Step:
    """One `schedule()` and one `update_from_output()` with the test as the model runner."""
    output = scheduler.schedule(*args, **kwargs)
    req_ids = list(output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        done_prompt = request.num_computed_tokens >= request.num_tokens
        sampled.append([SAMPLED_TOKEN] if done_prompt else [])
    runner_output = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )
    engine_outputs = scheduler.update_from_output(output, runner_output)
    cached = output.scheduled_cached_reqs
    resumed = read_field(cached, "resumed_req_ids")
    step = Step(
        scheduled=dict(output.num_scheduled_tokens),
        admitted=[new.req_id for new in read_field(output, "scheduled_new_reqs")]
        + [req_id for req_id in cached.req_ids if req_id in resumed],
        preempted=sorted(output.preempted_req_ids or ()),
    )
    for outputs in engine_outputs.values():
        for out in outputs.outputs:
            if out.new_token_ids:
                step.produced[out.request_id] = list(out.new_token_ids)
            if out.finish_reason is not None:
                step.finished.append(out.request_id)
                step.reasons[out.request_id] = (str(out.finish_reason), out.stop_reason)
    return step


#: The new names a renamed vLLM (the fault-injection tests') gives fields edgemon reads.
RENAMED = {"scheduled_new_reqs": "new_requests", "resumed_req_ids": "resumed_request_ids"}


def read_field(obj: Any, name: str) -> Any:
    """`obj`'s field `name`, or the same field under its new name in a renamed vLLM."""
    return getattr(obj, name) if hasattr(obj, name) else getattr(obj, RENAMED[name])


def rename_field(obj: Any, name: str) -> None:
    """Rename `obj`'s field `name` to its `RENAMED` name, as a vLLM release might."""
    setattr(obj, RENAMED[name], getattr(obj, name))
    delattr(obj, name)


class FlagGate:
    """A hand-written gate: throttles while `throttle` is set, counts how often it was asked."""

    __slots__ = ("asked", "throttle")

    def __init__(self, *, throttle: bool = False) -> None:
        self.throttle = throttle
        self.asked = 0

    def should_throttle_prefills(self) -> bool:
        """The flag."""
        self.asked += 1
        return self.throttle


def talker_classes() -> list[type[Any]]:
    """edgemon's vLLM scheduler, and its vLLM-Omni talker where vLLM-Omni imports."""
    from edgemon.integrations.vllm import EdgemonScheduler  # noqa: PLC0415

    try:
        from edgemon.integrations.vllm_omni import EdgemonOmniARScheduler  # noqa: PLC0415
    except ImportError:
        return [EdgemonScheduler]
    return [EdgemonScheduler, EdgemonOmniARScheduler]


def waiting_ids(scheduler: Any) -> list[str]:
    """The ids in the waiting queue, in the order vLLM would admit them."""
    return [request.request_id for request in scheduler.waiting]
