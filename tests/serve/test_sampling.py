"""The batched sampler and the streaming text: every option on known distributions."""

import math

import pytest
import torch

from trilm.serve.sampling import SamplingError, SamplingParams, make_generator, sample
from trilm.serve.text import TextStream

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def _draw(params: SamplingParams, logits: torch.Tensor, n: int, vocab: int | None = None) -> torch.Tensor:
    """``n`` draws for one row, batched as ``n`` rows with generators seeded 0..n−1."""
    vocab = vocab or logits.shape[-1]
    rows = logits.expand(n, -1)
    gens = [make_generator(i) for i in range(n)]
    return torch.tensor(sample(rows, [params] * n, gens, vocab))


def _freq(tokens: torch.Tensor, size: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=size).float() / tokens.numel()


def test_greedy_is_argmax_and_never_picks_padding():
    logits = torch.tensor([[0.1, 2.0, 0.3, 9.0, 9.5], [5.0, 0.0, 1.0, 0.0, 99.0]])  # ids 3, 4: padding
    greedy = SamplingParams(temperature=0)
    assert sample(logits, [greedy, greedy], [make_generator(0)] * 2, vocab_size=3) == [1, 0]
    hot = SamplingParams(temperature=2.0)
    drawn = _draw(hot, logits[:1], 500, vocab=3)
    assert int(drawn.max()) < 3


def test_temperature_draws_follow_the_softmax():
    logits = PROBS.log().unsqueeze(0)
    for temperature in (1.0, 2.0):
        want = torch.softmax(logits[0] / temperature, -1)
        got = _freq(_draw(SamplingParams(temperature=temperature), logits, 4000), 4)
        assert (got - want).abs().max() < 0.03, (temperature, got, want)


def test_top_k_keeps_the_k_most_likely():
    logits = PROBS.log().unsqueeze(0)
    got = _freq(_draw(SamplingParams(top_k=2), logits, 3000), 4)
    assert got[2] == 0 and got[3] == 0
    assert abs(float(got[0]) - 0.5 / 0.8) < 0.03
    assert set(_draw(SamplingParams(top_k=1, temperature=1.7), logits, 50).tolist()) == {0}


@pytest.mark.parametrize(
    ("top_p", "kept"), [(0.5, {0}), (0.7, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2}), (1.0, {0, 1, 2, 3})]
)
def test_top_p_keeps_the_smallest_nucleus(top_p, kept):
    logits = PROBS.log().unsqueeze(0)
    drawn = set(_draw(SamplingParams(top_p=top_p), logits, 3000).tolist())
    assert drawn == kept


def test_top_k_then_top_p_renormalised():
    # top-k 3 leaves [0.5, 0.3, 0.15]/0.95; a nucleus of 0.6 then needs the first two (0.526 < 0.6)
    logits = PROBS.log().unsqueeze(0)
    assert set(_draw(SamplingParams(top_k=3, top_p=0.6), logits, 2000).tolist()) == {0, 1}


def test_seeded_rows_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = [SamplingParams(seed=7, top_k=20, top_p=0.9)] + [SamplingParams(seed=i) for i in range(5)]
    alone = sample(logits[:1], params[:1], [make_generator(7)], 50)
    batched = sample(logits, params, [make_generator(p.seed) for p in params], 50)
    assert batched[0] == alone[0]
    mixed = [SamplingParams(temperature=0), *params[:1]]
    assert sample(logits[[1, 0]], mixed, [make_generator(0), make_generator(7)], 50)[1] == alone[0]


def test_generators_are_seeded_or_random():
    a, b = make_generator(3), make_generator(3)
    assert torch.rand(1, generator=a) == torch.rand(1, generator=b)
    c, d = make_generator(None), make_generator(None)
    assert torch.rand(4, generator=c).tolist() != torch.rand(4, generator=d).tolist()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens: must be >= 1"),
        ({"max_tokens": 2.5}, "max_tokens: must be an integer"),
        ({"temperature": -0.1}, "temperature: must be a finite number >= 0"),
        ({"temperature": math.nan}, "temperature: must be a finite number"),
        ({"top_p": 0.0}, r"top_p: must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p: must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k: must be >= 0"),
        ({"stop": ("ok", "")}, r"stop\[1\]: must be a non-empty string"),
        ({"seed": "7"}, "seed: must be an integer"),
        ({"stop_token_ids": (-3,)}, r"stop_token_ids\[0\]: must be >= 0"),
    ],
)
def test_bad_parameters_name_the_field(kwargs, message):
    with pytest.raises(SamplingError, match=message):
        SamplingParams(**kwargs)


def _stream(tokenizer, prompt: str, text: str, stop=()):
    stream = TextStream(tokenizer, tokenizer.encode(prompt), tuple(stop))
    pieces = []
    for token in tokenizer.encode(prompt + text)[len(tokenizer.encode(prompt)) :]:
        pieces.append(stream.push(token))
        if stream.stopped:
            break
    pieces.append(stream.finish())
    return pieces


def test_streamed_text_equals_the_decoded_text(tokenizer):
    text = " and the earth was without form — naïve café 🙂, void.\n\nNew paragraph"
    pieces = _stream(tokenizer, "In the beginning", text)
    whole = tokenizer.decode(tokenizer.encode("In the beginning" + text))
    assert "".join(pieces) == whole[len("In the beginning") :]
    assert "\ufffd" not in "".join(pieces[:-1])  # multi-byte characters are never split across deltas


def test_stop_string_ends_the_text_and_nothing_after_is_sent(tokenizer):
    pieces = _stream(tokenizer, "Q:", " first line\nUser: second line", stop=["\nUser:"])
    assert "".join(pieces) == " first line"
    pieces = _stream(tokenizer, "Q:", " alpha beta gamma", stop=["beta", "alp"])
    assert "".join(pieces) == " "  # the earliest match wins


def test_partial_stop_is_held_back_then_released(tokenizer):
    stream = TextStream(tokenizer, tokenizer.encode("x"), ("###",))
    sent = ""
    for token in tokenizer.encode("x ab## cd")[len(tokenizer.encode("x")) :]:
        sent += stream.push(token)
        assert not sent.endswith("#")  # a possible start of "###" is not sent yet
    sent += stream.finish()
    assert sent == " ab## cd" and not stream.stopped
