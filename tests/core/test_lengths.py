"""How many tokens a request generates when it does not say exactly (engine.sim.lengths),
and the engine's --workload draws (inference_lab.common.workload)."""

from inference_lab.common.workload import output_length_sampler
from inference_lab.engine.sim.lengths import OutputLength
from factories import core

WORKLOAD = """\
arrival_pattern = "poisson"
arrival_rate = 1.0
num_requests = 10
input_len_dist = { type = "fixed", value = 16 }
output_len_dist = { type = "uniform", min = 1, max = 1000 }
"""


def test_explicit_max_tokens_wins_without_a_workload():
    assert OutputLength(256).choose(7, prompt_len=10, largest=100) == 7


def test_the_default_is_capped_to_fit_the_largest_request():
    # 100 - 90 = 10 tokens of room
    assert OutputLength(256).choose(None, prompt_len=90, largest=100) == 10
    assert OutputLength(256).choose(None, prompt_len=10, largest=4096) == 256


def test_a_workload_draw_is_capped_by_max_tokens():
    draws = iter([50, 3])
    policy = OutputLength(256, sampler=lambda: next(draws))
    assert policy.choose(20, prompt_len=1, largest=4096) == 20  # min(50, 20)
    assert policy.choose(20, prompt_len=1, largest=4096) == 3


def test_workload_draws_are_reproducible_for_a_seed(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD)

    def draws(seed: int) -> list[int]:
        sample = output_length_sampler(path, seed)
        return [sample() for _ in range(5)]

    assert draws(7) == draws(7) != draws(8)
    assert all(1 <= n <= 1000 for n in draws(7))


def test_the_core_chooses_when_max_tokens_is_absent_within_what_the_model_takes():
    engine = core(max_model_len=4096, lengths=OutputLength(300))
    assert engine.max_request_tokens == 4096
    assert engine.submit(16, None, 0.0).max_tokens == 300
    assert engine.submit(4000, None, 0.0).max_tokens == 96  # the room left


def test_without_chunked_prefill_the_largest_request_is_one_steps_budget():
    assert core(enable_chunked_prefill=False).max_request_tokens == 8192
