"""Admission control in the engine, stepped by the test (no threads, no clock races): the waiting bound,
the prompt-token budget, all-or-none admission of one HTTP request's choices, and deadlines that free the
slot of a running request and drop a waiting one."""

import pytest
import torch

from tests.serve.conftest import VOCAB, greedy_reference, nano, random_state
from trilm.config import ConfigError
from trilm.infer import from_state_dict
from trilm.serve import Engine, SamplingParams
from trilm.serve.admission import Limits, Rejected


def _engine(max_batch=2, **limits):
    cfg = nano("floatlm")
    model = from_state_dict(cfg, random_state(cfg, seed=9))
    return model, Engine(model, max_batch=max_batch, limits=Limits(**limits))


def _prompt(n, seed=0):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def test_waiting_bound_counts_requests_beyond_the_free_slots():
    _, engine = _engine(max_batch=2, max_waiting=1)
    handles = [engine.submit(_prompt(5, i), _greedy(4)) for i in range(3)]  # 2 take slots, 1 waits
    with pytest.raises(Rejected, match=r"3 requests hold its 2 slots and its queue \(max_waiting 1\)") as e:
        engine.submit(_prompt(5, 9), _greedy(4))
    assert e.value.reason == "queue_full" and e.value.status == 429 and e.value.retry_after >= 1
    assert engine.occupancy.rejected["queue_full"] == 1
    assert engine.occupancy.counts() == (0, 1, 5)  # admitted, none prefilled yet: one of three must wait
    engine.step()
    assert engine.num_running == 2 and engine.occupancy.counts() == (2, 1, 5)
    for h in handles:
        assert h.result().finish_reason == "length"
    assert engine.occupancy.counts() == (0, 0, 0)
    assert engine.submit(_prompt(5, 9), _greedy(4)).result().finish_reason == "length"  # room again


def test_no_waiting_at_all_and_all_or_none_admission():
    _, engine = _engine(max_batch=2, max_waiting=0)
    engine.submit(_prompt(4), _greedy(3))
    jobs = [(_prompt(4, 1), _greedy(3))] * 2  # one HTTP request with n=2: only one place is left
    with pytest.raises(Rejected, match="no room for 2 more") as e:
        engine.submit_all(jobs)
    assert e.value.reason == "queue_full"
    assert engine.num_waiting == 1  # nothing of the refused request was queued
    engine.submit(_prompt(4, 2), _greedy(3))
    while engine.step():
        pass
    assert engine.finished["length"] == 2 and engine.occupancy.counts() == (0, 0, 0)


def test_prompt_token_budget_of_the_waiting_requests():
    _, engine = _engine(max_batch=1, max_waiting_tokens=20)
    engine.submit(_prompt(50), _greedy(2))  # takes the free slot: not waiting, not counted
    engine.submit(_prompt(30, 1), _greedy(2))  # waits alone: always allowed, whatever its length
    with pytest.raises(Rejected, match=r"would hold 33 tokens, over the server's budget of 20") as e:
        engine.submit(_prompt(3, 2), _greedy(2))
    assert e.value.reason == "queue_tokens_full"
    while engine.step():
        pass
    engine.submit(_prompt(12, 3), _greedy(2))
    engine.submit(_prompt(8, 4), _greedy(2))
    engine.submit(_prompt(12, 5), _greedy(2))  # 8 + 12 = 20 waiting: at the budget, admitted
    assert engine.occupancy.counts() == (0, 2, 20)


def test_a_running_request_past_its_deadline_frees_its_slot():
    model, engine = _engine(max_batch=2, request_timeout=3600)
    p = [_prompt(n, i) for i, n in enumerate((6, 9, 4))]
    a = engine.submit(p[0], _greedy(30))
    b = engine.submit(p[1], _greedy(12))
    for _ in range(4):
        engine.step()
    assert engine.num_running == 2 and a.deadline == pytest.approx(a.submitted_at + 3600)
    a.deadline = 0.0  # its deadline has passed
    had = list(a.token_ids)
    c = engine.submit(p[2], _greedy(10))
    engine.step()
    assert a.finished and a.finish_reason == "timeout" and engine.finished["timeout"] == 1
    assert a.token_ids == had  # the tokens it had stay; it produced none after its deadline
    assert a.result().finish_reason == "timeout"
    assert engine.num_running == 2  # c took the freed slot (and b was moved, cache rows and all)
    for prompt, handle in ((p[1], b), (p[2], c)):
        out = handle.result()
        assert out.token_ids == greedy_reference(model, prompt, len(out.token_ids))
    assert engine.occupancy.counts() == (0, 0, 0)


def test_a_waiting_request_past_its_deadline_never_starts():
    _, engine = _engine(max_batch=1, request_timeout=3600)
    running = engine.submit(_prompt(5), _greedy(6))
    queued = engine.submit(_prompt(5, 1), _greedy(6))
    engine.step()
    queued.deadline = 0.0
    engine.step()
    assert queued.finish_reason == "timeout" and queued.token_ids == [] and queued.first_token_at is None
    assert running.result().finish_reason == "length"


def test_limits_are_validated_and_a_stopping_engine_refuses():
    with pytest.raises(ConfigError, match="max_waiting: must be >= 0"):
        Limits(max_waiting=-1)
    with pytest.raises(ConfigError, match="max_waiting_tokens: must be >= 1"):
        Limits(max_waiting_tokens=0)
    with pytest.raises(ConfigError, match="request_timeout: must be > 0"):
        Limits(request_timeout=0)
    _, engine = _engine()
    engine._stopping = True
    with pytest.raises(Rejected, match="shutting down") as e:
        engine.submit(_prompt(3), _greedy(2))
    assert e.value.status == 503
    engine._stopping = False
    assert engine.generate([_prompt(3)] * 5, _greedy(2))[4].finish_reason == "length"  # unbounded default
