"""The generation API on the real model: records, finish reasons, context overflow, streaming text."""

from phoenix_chat import engine
from phoenix_chat.engine.generate import generate, generate_step, stream_generate
from phoenix_chat.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)


def test_stream_records_carry_text_ids_and_timings(cpu_model):
    records = list(stream_generate(cpu_model, "The capital of France is", GREEDY, max_tokens=6, raw=True))
    final = records[-1]
    assert final.finish_reason == "length" and final.generation_tokens == 6
    assert all(r.finish_reason is None for r in records[:-1])
    assert final.prompt_tokens == len(cpu_model.tokenizer.encode("The capital of France is"))
    assert final.ttft_s > 0 and final.prompt_tps > 0 and final.generation_tps > 0
    text = "".join(r.text for r in records)
    ids = list(generate_step(cpu_model, cpu_model.tokenizer.encode("The capital of France is"), GREEDY, 6))
    assert text == cpu_model.tokenizer.decode(ids)


def test_stop_token_ends_with_stop(cpu_model, llama_reference):
    """Treat "." (the 7th greedy token of the reference answer) as a stop token: the stream must
    end there with finish_reason "stop", without emitting it."""
    import dataclasses

    chat = llama_reference["chat_prompt"]
    period = chat["greedy_48_ids"][6]
    stopping = dataclasses.replace(
        cpu_model, config=dataclasses.replace(cpu_model.config, eos_token_ids=(1, 106, period))
    )
    records = list(stream_generate(stopping, chat["messages"], GREEDY, max_tokens=20))
    assert records[-1].finish_reason == "stop" and records[-1].generation_tokens == 6
    assert "".join(r.text for r in records) == cpu_model.tokenizer.decode(chat["greedy_48_ids"][:6])


def test_context_overflow_is_a_finish_reason_not_a_crash(model_path):
    small = engine.load(model_path, backend="cpu", context_length=24)
    prompt = "one two three four five six seven eight nine ten"
    records = list(stream_generate(small, prompt, GREEDY, max_tokens=100, raw=True))
    assert records[-1].finish_reason == "context"
    assert records[-1].prompt_tokens + records[-1].generation_tokens <= 24
    too_long = " ".join(["word"] * 40)
    assert list(stream_generate(small, too_long, GREEDY, max_tokens=5, raw=True))[-1].finish_reason == "context"


def test_same_seed_same_text(cpu_model):
    p = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=1234)
    a = generate(cpu_model, "Once upon a time", p, max_tokens=10, raw=True)
    b = generate(cpu_model, "Once upon a time", p, max_tokens=10, raw=True)
    assert a == b and a


def test_closing_the_stream_stops_generation(cpu_model):
    stream = stream_generate(cpu_model, "Count: 1, 2, 3,", GREEDY, max_tokens=50, raw=True)
    next(stream)
    stream.close()  # the GUI's Stop: no exception, no further work
