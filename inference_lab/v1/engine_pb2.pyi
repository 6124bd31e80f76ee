from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ABORTED: _ClassVar[FinishReason]

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]
    PAUSE_MODE_WAIT: _ClassVar[PauseMode]
    PAUSE_MODE_KEEP: _ClassVar[PauseMode]

class EngineFaultKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_FAULT_KIND_UNSPECIFIED: _ClassVar[EngineFaultKind]
    ENGINE_FAULT_CRASH: _ClassVar[EngineFaultKind]
    ENGINE_FAULT_STALL: _ClassVar[EngineFaultKind]
    ENGINE_FAULT_SLOW: _ClassVar[EngineFaultKind]
    ENGINE_FAULT_CLEAR: _ClassVar[EngineFaultKind]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ABORTED: FinishReason
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_ABORT: PauseMode
PAUSE_MODE_WAIT: PauseMode
PAUSE_MODE_KEEP: PauseMode
ENGINE_FAULT_KIND_UNSPECIFIED: EngineFaultKind
ENGINE_FAULT_CRASH: EngineFaultKind
ENGINE_FAULT_STALL: EngineFaultKind
ENGINE_FAULT_SLOW: EngineFaultKind
ENGINE_FAULT_CLEAR: EngineFaultKind

class SubmitRequest(_message.Message):
    __slots__ = ("model", "prompt_tokens", "max_tokens", "priority", "request_id", "prompt_token_ids", "n", "stop_at_end", "replica", "arrival_monotonic_s", "reasoning_share", "kv_transfer_params")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    STOP_AT_END_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_MONOTONIC_S_FIELD_NUMBER: _ClassVar[int]
    REASONING_SHARE_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt_tokens: int
    max_tokens: int
    priority: int
    request_id: str
    prompt_token_ids: bytes
    n: int
    stop_at_end: bool
    replica: int
    arrival_monotonic_s: float
    reasoning_share: float
    kv_transfer_params: KvTransferParams
    def __init__(self, model: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., priority: _Optional[int] = ..., request_id: _Optional[str] = ..., prompt_token_ids: _Optional[bytes] = ..., n: _Optional[int] = ..., stop_at_end: _Optional[bool] = ..., replica: _Optional[int] = ..., arrival_monotonic_s: _Optional[float] = ..., reasoning_share: _Optional[float] = ..., kv_transfer_params: _Optional[_Union[KvTransferParams, _Mapping]] = ...) -> None: ...

class KvTransferParams(_message.Message):
    __slots__ = ("do_remote_decode", "do_remote_prefill", "remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "remote_request_id", "tp_size", "max_load_tokens", "max_offload_tokens", "kv_load_tiers", "kv_load_tiers_given")
    DO_REMOTE_DECODE_FIELD_NUMBER: _ClassVar[int]
    DO_REMOTE_PREFILL_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_HOST_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PORT_FIELD_NUMBER: _ClassVar[int]
    REMOTE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOAD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFLOAD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_LOAD_TIERS_FIELD_NUMBER: _ClassVar[int]
    KV_LOAD_TIERS_GIVEN_FIELD_NUMBER: _ClassVar[int]
    do_remote_decode: bool
    do_remote_prefill: bool
    remote_engine_id: str
    remote_block_ids: _containers.RepeatedScalarFieldContainer[int]
    remote_host: str
    remote_port: int
    remote_request_id: str
    tp_size: int
    max_load_tokens: int
    max_offload_tokens: int
    kv_load_tiers: _containers.RepeatedScalarFieldContainer[str]
    kv_load_tiers_given: bool
    def __init__(self, do_remote_decode: _Optional[bool] = ..., do_remote_prefill: _Optional[bool] = ..., remote_engine_id: _Optional[str] = ..., remote_block_ids: _Optional[_Iterable[int]] = ..., remote_host: _Optional[str] = ..., remote_port: _Optional[int] = ..., remote_request_id: _Optional[str] = ..., tp_size: _Optional[int] = ..., max_load_tokens: _Optional[int] = ..., max_offload_tokens: _Optional[int] = ..., kv_load_tiers: _Optional[_Iterable[str]] = ..., kv_load_tiers_given: _Optional[bool] = ...) -> None: ...

class Admitted(_message.Message):
    __slots__ = ("engine_request_id", "waiting", "reasoning_tokens")
    ENGINE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    engine_request_id: int
    waiting: int
    reasoning_tokens: int
    def __init__(self, engine_request_id: _Optional[int] = ..., waiting: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class Tokens(_message.Message):
    __slots__ = ("new_tokens", "total_tokens", "index")
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    new_tokens: int
    total_tokens: int
    index: int
    def __init__(self, new_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("reason", "prompt_tokens", "completion_tokens", "queue_time_s", "ttft_s", "e2e_s", "preemptions", "cached_tokens", "index", "kv_transfer_params", "external_tokens")
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    queue_time_s: float
    ttft_s: float
    e2e_s: float
    preemptions: int
    cached_tokens: int
    index: int
    kv_transfer_params: KvTransferParams
    external_tokens: int
    def __init__(self, reason: _Optional[_Union[FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., queue_time_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., e2e_s: _Optional[float] = ..., preemptions: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., index: _Optional[int] = ..., kv_transfer_params: _Optional[_Union[KvTransferParams, _Mapping]] = ..., external_tokens: _Optional[int] = ...) -> None: ...

class SubmitEvent(_message.Message):
    __slots__ = ("admitted", "tokens", "finished")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    admitted: Admitted
    tokens: Tokens
    finished: Finished
    def __init__(self, admitted: _Optional[_Union[Admitted, _Mapping]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class Rejected(_message.Message):
    __slots__ = ("code", "reason", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SessionLaneRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionLaneInfo(_message.Message):
    __slots__ = ("host", "port", "token", "clock_id", "max_frame_bytes", "window_bytes")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_BYTES_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    token: bytes
    clock_id: str
    max_frame_bytes: int
    window_bytes: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ..., token: _Optional[bytes] = ..., clock_id: _Optional[str] = ..., max_frame_bytes: _Optional[int] = ..., window_bytes: _Optional[int] = ...) -> None: ...

class LaneHello(_message.Message):
    __slots__ = ("token", "clock_id")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    clock_id: str
    def __init__(self, token: _Optional[bytes] = ..., clock_id: _Optional[str] = ...) -> None: ...

class SessionActions(_message.Message):
    __slots__ = ("actions", "relay_lag_s", "lane_read_bytes", "hold_s")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    RELAY_LAG_S_FIELD_NUMBER: _ClassVar[int]
    LANE_READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOLD_S_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[SessionAction]
    relay_lag_s: float
    lane_read_bytes: int
    hold_s: float
    def __init__(self, actions: _Optional[_Iterable[_Union[SessionAction, _Mapping]]] = ..., relay_lag_s: _Optional[float] = ..., lane_read_bytes: _Optional[int] = ..., hold_s: _Optional[float] = ...) -> None: ...

class SessionAction(_message.Message):
    __slots__ = ("open", "cancel", "refused")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    open: Open
    cancel: Cancel
    refused: Refused
    def __init__(self, open: _Optional[_Union[Open, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., refused: _Optional[_Union[Refused, _Mapping]] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("tag", "request")
    TAG_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    tag: int
    request: SubmitRequest
    def __init__(self, tag: _Optional[int] = ..., request: _Optional[_Union[SubmitRequest, _Mapping]] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("tag",)
    TAG_FIELD_NUMBER: _ClassVar[int]
    tag: int
    def __init__(self, tag: _Optional[int] = ...) -> None: ...

class Refused(_message.Message):
    __slots__ = ("model", "count", "replica")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    model: str
    count: int
    replica: int
    def __init__(self, model: _Optional[str] = ..., count: _Optional[int] = ..., replica: _Optional[int] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("tag", "admitted", "tokens", "finished", "rejected")
    TAG_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    tag: int
    admitted: Admitted
    tokens: Tokens
    finished: Finished
    rejected: Rejected
    def __init__(self, tag: _Optional[int] = ..., admitted: _Optional[_Union[Admitted, _Mapping]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., rejected: _Optional[_Union[Rejected, _Mapping]] = ...) -> None: ...

class ProgressBatch(_message.Message):
    __slots__ = ("events", "token_tags", "token_totals", "queue_states", "metrics_seq", "metrics", "sent_monotonic_s")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TAGS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TOTALS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_STATES_FIELD_NUMBER: _ClassVar[int]
    METRICS_SEQ_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SENT_MONOTONIC_S_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Progress]
    token_tags: _containers.RepeatedScalarFieldContainer[int]
    token_totals: _containers.RepeatedScalarFieldContainer[int]
    queue_states: _containers.RepeatedCompositeFieldContainer[QueueState]
    metrics_seq: int
    metrics: MetricsPush
    sent_monotonic_s: float
    def __init__(self, events: _Optional[_Iterable[_Union[Progress, _Mapping]]] = ..., token_tags: _Optional[_Iterable[int]] = ..., token_totals: _Optional[_Iterable[int]] = ..., queue_states: _Optional[_Iterable[_Union[QueueState, _Mapping]]] = ..., metrics_seq: _Optional[int] = ..., metrics: _Optional[_Union[MetricsPush, _Mapping]] = ..., sent_monotonic_s: _Optional[float] = ...) -> None: ...

class QueueState(_message.Message):
    __slots__ = ("model", "saturated", "waiting", "max_waiting", "replica", "message", "since_monotonic_s", "until_monotonic_s")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SATURATED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SINCE_MONOTONIC_S_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MONOTONIC_S_FIELD_NUMBER: _ClassVar[int]
    model: str
    saturated: bool
    waiting: int
    max_waiting: int
    replica: int
    message: str
    since_monotonic_s: float
    until_monotonic_s: float
    def __init__(self, model: _Optional[str] = ..., saturated: _Optional[bool] = ..., waiting: _Optional[int] = ..., max_waiting: _Optional[int] = ..., replica: _Optional[int] = ..., message: _Optional[str] = ..., since_monotonic_s: _Optional[float] = ..., until_monotonic_s: _Optional[float] = ...) -> None: ...

class GetCapacityRequest(_message.Message):
    __slots__ = ("model", "replica")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    model: str
    replica: int
    def __init__(self, model: _Optional[str] = ..., replica: _Optional[int] = ...) -> None: ...

class SetCapacityRequest(_message.Message):
    __slots__ = ("model", "max_num_seqs", "max_waiting", "replica")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    model: str
    max_num_seqs: int
    max_waiting: int
    replica: int
    def __init__(self, model: _Optional[str] = ..., max_num_seqs: _Optional[int] = ..., max_waiting: _Optional[int] = ..., replica: _Optional[int] = ...) -> None: ...

class ModelCapacity(_message.Message):
    __slots__ = ("model", "max_waiting", "max_num_seqs", "waiting", "running", "replica", "starting", "draining", "ready_in_s", "sleep_level", "wake_s", "kv_role", "kv_engine_id", "paused")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    READY_IN_S_FIELD_NUMBER: _ClassVar[int]
    SLEEP_LEVEL_FIELD_NUMBER: _ClassVar[int]
    WAKE_S_FIELD_NUMBER: _ClassVar[int]
    KV_ROLE_FIELD_NUMBER: _ClassVar[int]
    KV_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    model: str
    max_waiting: int
    max_num_seqs: int
    waiting: int
    running: int
    replica: int
    starting: bool
    draining: bool
    ready_in_s: float
    sleep_level: int
    wake_s: float
    kv_role: str
    kv_engine_id: str
    paused: PauseMode
    def __init__(self, model: _Optional[str] = ..., max_waiting: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., replica: _Optional[int] = ..., starting: _Optional[bool] = ..., draining: _Optional[bool] = ..., ready_in_s: _Optional[float] = ..., sleep_level: _Optional[int] = ..., wake_s: _Optional[float] = ..., kv_role: _Optional[str] = ..., kv_engine_id: _Optional[str] = ..., paused: _Optional[_Union[PauseMode, str]] = ...) -> None: ...

class CapacityResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelCapacity]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelCapacity, _Mapping]]] = ...) -> None: ...

class SetCapacityResponse(_message.Message):
    __slots__ = ("models", "queue_states")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_STATES_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelCapacity]
    queue_states: _containers.RepeatedCompositeFieldContainer[QueueState]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelCapacity, _Mapping]]] = ..., queue_states: _Optional[_Iterable[_Union[QueueState, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "hardware", "tp", "max_model_len", "kv_blocks", "block_size", "parent", "lora_rank", "max_request_tokens", "pooling", "max_num_batched_tokens", "enable_chunked_prefill", "gpu_memory_utilization", "kv_offload")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_CHUNKED_PREFILL_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    KV_OFFLOAD_FIELD_NUMBER: _ClassVar[int]
    name: str
    hardware: str
    tp: int
    max_model_len: int
    kv_blocks: int
    block_size: int
    parent: str
    lora_rank: int
    max_request_tokens: int
    pooling: PoolingInfo
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    gpu_memory_utilization: float
    kv_offload: KvOffloadInfo
    def __init__(self, name: _Optional[str] = ..., hardware: _Optional[str] = ..., tp: _Optional[int] = ..., max_model_len: _Optional[int] = ..., kv_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., parent: _Optional[str] = ..., lora_rank: _Optional[int] = ..., max_request_tokens: _Optional[int] = ..., pooling: _Optional[_Union[PoolingInfo, _Mapping]] = ..., max_num_batched_tokens: _Optional[int] = ..., enable_chunked_prefill: _Optional[bool] = ..., gpu_memory_utilization: _Optional[float] = ..., kv_offload: _Optional[_Union[KvOffloadInfo, _Mapping]] = ...) -> None: ...

class KvOffloadInfo(_message.Message):
    __slots__ = ("size_gib", "backend", "kv_transfer_config_json")
    SIZE_GIB_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    size_gib: float
    backend: str
    kv_transfer_config_json: str
    def __init__(self, size_gib: _Optional[float] = ..., backend: _Optional[str] = ..., kv_transfer_config_json: _Optional[str] = ...) -> None: ...

class PoolingInfo(_message.Message):
    __slots__ = ("task", "dimensions", "normalize", "matryoshka", "matryoshka_dimensions", "pooling_type")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    MATRYOSHKA_FIELD_NUMBER: _ClassVar[int]
    MATRYOSHKA_DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    POOLING_TYPE_FIELD_NUMBER: _ClassVar[int]
    task: str
    dimensions: int
    normalize: bool
    matryoshka: bool
    matryoshka_dimensions: _containers.RepeatedScalarFieldContainer[int]
    pooling_type: str
    def __init__(self, task: _Optional[str] = ..., dimensions: _Optional[int] = ..., normalize: _Optional[bool] = ..., matryoshka: _Optional[bool] = ..., matryoshka_dimensions: _Optional[_Iterable[int]] = ..., pooling_type: _Optional[str] = ...) -> None: ...

class LoadLoraAdapterRequest(_message.Message):
    __slots__ = ("lora_name", "lora_path", "base_model_name")
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    lora_path: str
    base_model_name: str
    def __init__(self, lora_name: _Optional[str] = ..., lora_path: _Optional[str] = ..., base_model_name: _Optional[str] = ...) -> None: ...

class UnloadLoraAdapterRequest(_message.Message):
    __slots__ = ("lora_name",)
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    def __init__(self, lora_name: _Optional[str] = ...) -> None: ...

class LoraAdapterResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class SleepRequest(_message.Message):
    __slots__ = ("model", "replica", "level", "wake", "tags")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    WAKE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    model: str
    replica: int
    level: int
    wake: bool
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., replica: _Optional[int] = ..., level: _Optional[int] = ..., wake: _Optional[bool] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("model", "replica", "mode", "clear_cache", "resume")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CLEAR_CACHE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    model: str
    replica: int
    mode: PauseMode
    clear_cache: bool
    resume: bool
    def __init__(self, model: _Optional[str] = ..., replica: _Optional[int] = ..., mode: _Optional[_Union[PauseMode, str]] = ..., clear_cache: _Optional[bool] = ..., resume: _Optional[bool] = ...) -> None: ...

class ResetPrefixCacheRequest(_message.Message):
    __slots__ = ("model", "replica", "reset_external")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    RESET_EXTERNAL_FIELD_NUMBER: _ClassVar[int]
    model: str
    replica: int
    reset_external: bool
    def __init__(self, model: _Optional[str] = ..., replica: _Optional[int] = ..., reset_external: _Optional[bool] = ...) -> None: ...

class ResetPrefixCacheResponse(_message.Message):
    __slots__ = ("blocks_cleared",)
    BLOCKS_CLEARED_FIELD_NUMBER: _ClassVar[int]
    blocks_cleared: int
    def __init__(self, blocks_cleared: _Optional[int] = ...) -> None: ...

class SetReplicasRequest(_message.Message):
    __slots__ = ("model", "replicas")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    model: str
    replicas: int
    def __init__(self, model: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class GetMetricsRequest(_message.Message):
    __slots__ = ("models", "engines")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedScalarFieldContainer[str]
    engines: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, models: _Optional[_Iterable[str]] = ..., engines: _Optional[_Iterable[int]] = ...) -> None: ...

class MetricsText(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: bytes
    def __init__(self, text: _Optional[bytes] = ...) -> None: ...

class WatchMetricsRequest(_message.Message):
    __slots__ = ("interval_s",)
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    def __init__(self, interval_s: _Optional[float] = ...) -> None: ...

class MetricsPush(_message.Message):
    __slots__ = ("seq", "replicas", "gone", "partial")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    seq: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaMetrics]
    gone: _containers.RepeatedScalarFieldContainer[int]
    partial: bool
    def __init__(self, seq: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaMetrics, _Mapping]]] = ..., gone: _Optional[_Iterable[int]] = ..., partial: _Optional[bool] = ...) -> None: ...

class ReplicaMetrics(_message.Message):
    __slots__ = ("engine", "text")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    engine: int
    text: bytes
    def __init__(self, engine: _Optional[int] = ..., text: _Optional[bytes] = ...) -> None: ...

class InjectFaultRequest(_message.Message):
    __slots__ = ("kind", "seconds", "factor", "replica")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    kind: EngineFaultKind
    seconds: float
    factor: float
    replica: int
    def __init__(self, kind: _Optional[_Union[EngineFaultKind, str]] = ..., seconds: _Optional[float] = ..., factor: _Optional[float] = ..., replica: _Optional[int] = ...) -> None: ...

class GetFaultStateRequest(_message.Message):
    __slots__ = ("replica",)
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: int
    def __init__(self, replica: _Optional[int] = ...) -> None: ...

class EngineFaultState(_message.Message):
    __slots__ = ("stalled_for_s", "slow_factor", "slow_for_s", "replica")
    STALLED_FOR_S_FIELD_NUMBER: _ClassVar[int]
    SLOW_FACTOR_FIELD_NUMBER: _ClassVar[int]
    SLOW_FOR_S_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    stalled_for_s: float
    slow_factor: float
    slow_for_s: float
    replica: int
    def __init__(self, stalled_for_s: _Optional[float] = ..., slow_factor: _Optional[float] = ..., slow_for_s: _Optional[float] = ..., replica: _Optional[int] = ...) -> None: ...

class GetKvEventSourcesRequest(_message.Message):
    __slots__ = ("replica",)
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: int
    def __init__(self, replica: _Optional[int] = ...) -> None: ...

class KvEventSource(_message.Message):
    __slots__ = ("replica", "data_parallel_rank", "endpoint", "replay_endpoint", "topic", "hwm", "buffer_steps")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    DATA_PARALLEL_RANK_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REPLAY_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    HWM_FIELD_NUMBER: _ClassVar[int]
    BUFFER_STEPS_FIELD_NUMBER: _ClassVar[int]
    replica: int
    data_parallel_rank: int
    endpoint: str
    replay_endpoint: str
    topic: str
    hwm: int
    buffer_steps: int
    def __init__(self, replica: _Optional[int] = ..., data_parallel_rank: _Optional[int] = ..., endpoint: _Optional[str] = ..., replay_endpoint: _Optional[str] = ..., topic: _Optional[str] = ..., hwm: _Optional[int] = ..., buffer_steps: _Optional[int] = ...) -> None: ...

class KvEventSources(_message.Message):
    __slots__ = ("sources",)
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedCompositeFieldContainer[KvEventSource]
    def __init__(self, sources: _Optional[_Iterable[_Union[KvEventSource, _Mapping]]] = ...) -> None: ...
