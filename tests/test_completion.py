"""Completion mode (engine/completion.py): the conversation as one text, fitted to the context,
ending at the first blank line — on the real embedded model's tokenizer and context."""

from __future__ import annotations

from phoenix_chat.engine.completion import ParagraphStop, completion_text, fit_completion
from phoenix_chat.engine.prompt_fit import CUT_MARK


def feed_all(stop: ParagraphStop, deltas: list[str]) -> str:
    out = ""
    for d in deltas:
        out += stop.feed(d)
        if stop.stopped:
            return out
    return out + stop.flush()


def test_answers_run_on_and_new_messages_start_a_paragraph():
    messages = [
        {"role": "system", "content": "Facts about capitals."},
        {"role": "user", "content": "The capital of France is"},
        {"role": "assistant", "content": " Paris. "},
        {"role": "user", "content": "The capital of Italy is"},
        {"role": "assistant", "content": ""},  # an answer not started yet adds nothing
    ]
    assert completion_text(messages) == (
        "Facts about capitals.\n\nThe capital of France is Paris.\n\nThe capital of Italy is"
    )


def test_the_answer_ends_at_the_first_blank_line_even_split_over_deltas():
    assert feed_all(ParagraphStop(), [" London is", " the capital.\n", "\n2. Rome"]) == " London is the capital."
    stop = ParagraphStop()
    assert stop.feed(" one\n") == " one"  # a newline that may begin a blank line is held back
    assert stop.feed("two") == "\ntwo" and not stop.stopped  # ... and let go when it does not


def test_blank_lines_before_any_text_do_not_end_it():
    assert feed_all(ParagraphStop(), ["\n\n", "I am glad.", "\n\nI am"]) == "\n\nI am glad."
    assert feed_all(ParagraphStop(), [" no blank line", " at all"]) == " no blank line at all"


def test_a_completion_prompt_is_bos_plus_the_text_and_control_strings_stay_text(cpu_model):
    tok = cpu_model.tokenizer
    fitted = fit_completion(cpu_model, [{"role": "user", "content": "The capital of France is"}])
    assert list(fitted.prompt.ids) == tok.encode("The capital of France is", add_bos=True, parse_special=False)
    assert not fitted.changed
    typed = fit_completion(cpu_model, [{"role": "user", "content": "a <end_of_turn> b"}])
    assert tok.token_to_id("<end_of_turn>") not in typed.prompt.ids


def test_a_text_longer_than_the_context_keeps_its_end_or_its_both_ends(cpu_model):
    tok = cpu_model.tokenizer
    text = "BEGIN " + "some words to fill the context window " * 400 + "END"
    ids = tok.encode(text, add_bos=True, parse_special=False)
    assert len(ids) > cpu_model.backend.context_length
    tail = fit_completion(cpu_model, [{"role": "user", "content": text}], "drop_oldest", 100)
    limit = cpu_model.backend.context_length - 100
    assert len(tail.prompt.ids) == limit and tail.cut_from == "start"
    assert tail.prompt.ids[0] == tok.bos_id and list(tail.prompt.ids[-20:]) == ids[-20:]
    assert tail.cut_tokens == len(ids) - limit and tail.total_tokens == len(ids)
    both = fit_completion(cpu_model, [{"role": "user", "content": text}], "truncate_middle", 100)
    assert len(both.prompt.ids) == limit and both.cut_from == "middle"
    assert list(both.prompt.ids[:10]) == ids[:10] and list(both.prompt.ids[-10:]) == ids[-10:]
    assert CUT_MARK.strip() in tok.decode(list(both.prompt.ids))
