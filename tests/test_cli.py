"""The `phoenix-chat` command line, end to end, in subprocesses on the real embedded model."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

GOLDENS = Path(__file__).parent / "goldens"


def cli(*args, env_extra=None, timeout=600):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "phoenix_chat.app.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_help_lists_every_command_and_each_command_has_help():
    """`phoenix-chat --help` crashed on a stray '%' in one command's help (argparse formats it)."""
    from phoenix_chat.app.cli import build_parser

    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert commands and all(name in proc.stdout for name in commands)
    assert "% of roofline" in proc.stdout
    for name, sub in commands.items():
        assert sub.format_help().startswith("usage: "), name  # what `phoenix-chat NAME --help` prints


def test_export_prints_every_saved_conversation_as_json_or_markdown(tmp_path):
    """`phoenix-chat export [--format]` on the app's real SQLite history (PHOENIX_CHAT_HOME)."""
    from phoenix_chat.app.store import Store

    home = tmp_path / "home"
    store = Store(home=home)
    for title, said in (("Rivers", "The Nile."), ("Hills", "The Downs.")):
        conv = store.create_conversation(title)
        store.add_message(conv.id, "user", f"Name some {title.lower()}.")
        store.add_message(conv.id, "assistant", said)
    store.close()
    env = {"PHOENIX_CHAT_HOME": str(home)}
    as_json = cli("export", env_extra=env)  # json is the default
    assert as_json.returncode == 0, as_json.stderr
    exported = json.loads(as_json.stdout)["conversations"]
    assert [c["title"] for c in exported] == ["Rivers", "Hills"]
    assert [m["content"] for m in exported[1]["messages"]] == ["Name some hills.", "The Downs."]
    as_markdown = cli("export", "--format", "markdown", env_extra=env)
    assert as_markdown.returncode == 0 and "# Rivers" in as_markdown.stdout and "The Downs." in as_markdown.stdout
    assert cli("export", "--format", "csv", env_extra=env).returncode == 2


def test_run_streams_greedy_answer_to_stdout(llama_reference, cpu_model):
    chat = llama_reference["chat_prompt"]
    proc = cli("run", chat["messages"][0]["content"], "--backend", "cpu", "--temperature", "0", "--max-tokens", "16")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == cpu_model.tokenizer.decode(chat["greedy_48_ids"][:16]) + "\n"
    assert "generated 16 tok" in proc.stderr and "finish: length" in proc.stderr
    assert "base model, not instruction-tuned" in proc.stderr and "--raw continues PROMPT" in proc.stderr


def test_run_with_a_draft_model_gives_the_same_answer_and_reports_acceptance(
    llama_reference, cpu_model, draft_path, tmp_path
):
    chat = llama_reference["chat_prompt"]
    proc = cli(
        "run",
        chat["messages"][0]["content"],
        "--backend",
        "cpu",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--draft",
        str(draft_path),
        "--draft-tokens",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == cpu_model.tokenizer.decode(chat["greedy_48_ids"][:12]) + "\n"
    assert "generated 12 tok" in proc.stderr
    # --draft-tokens 3 at the engine: every pass but the last one or two (cut by --max-tokens) proposes 3
    found = re.search(r"proposals accepted (\d+)/(\d+) \(\d+ %\) in (\d+) target passes of up to 3,", proc.stderr)
    assert found, proc.stderr
    accepted, proposed, passes = map(int, found.groups())
    assert 3 * passes - 3 <= proposed <= 3 * passes and accepted + passes >= 12, proc.stderr
    from .tinymodels import tiny_gguf

    other = cli("run", "hi", "--backend", "cpu", "--draft", str(tiny_gguf(tmp_path / "tiny.gguf")))
    assert other.returncode == 2 and "does not share the tokenizer" in other.stderr


def test_run_raw_and_seeded_sampling_is_reproducible():
    args = (
        "run",
        "The capital of France is",
        "--raw",
        "--backend",
        "cpu",
        "--max-tokens",
        "8",
        "--seed",
        "42",
        "--temperature",
        "0.9",
    )
    first, second = cli(*args), cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and first.stdout.strip()
    assert "base model" not in first.stderr  # --raw is what the note suggests


def test_tokenize_matches_llama_cpp(llama_reference):
    for case in llama_reference["tokenize_llama_cpp"][:4]:
        proc = cli("tokenize", case["text"])
        assert proc.returncode == 0, proc.stderr
        assert [int(x) for x in proc.stdout.split()] == case["ids"]


def test_tokenize_model_reads_that_files_vocabulary(tmp_path):
    """--model: the ids come from that file's tokenizer (the tiny test model's 300 tokens), not the
    embedded model's."""
    from phoenix_chat.engine.weights import open_weights

    from .tinymodels import tiny_gguf

    path = tiny_gguf(tmp_path / "tiny.gguf")
    text = "<t5><t7> hello"
    proc = cli("tokenize", text, "--model", str(path))
    assert proc.returncode == 0, proc.stderr
    ids = [int(x) for x in proc.stdout.split()]
    w = open_weights(path)
    try:
        assert ids == w.tokenizer().encode(text, add_bos=True, parse_special=True)
    finally:
        w.close()
    assert max(ids) < 300 and ids != [int(x) for x in cli("tokenize", text).stdout.split()]


def test_info_human_and_json():
    proc = cli("info")
    assert proc.returncode == 0
    assert "18 layers" in proc.stdout and "Q4_K" in proc.stdout and "262144" in proc.stdout
    info = json.loads(cli("info", "--json").stdout)
    assert info["architecture"] == "gemma3" and info["layers"] == 18 and info["tensor_types"]["Q5_0"] == 81


def test_devices_reports_every_kind_honestly():
    entries = json.loads(cli("devices", "--json").stdout)
    kinds = {e["kind"]: e for e in entries}
    assert kinds["cpu"]["available"] is True
    assert "npu" in kinds and kinds["npu"]["available"] is False and kinds["npu"]["status"]
    assert "vulkan" in kinds


def test_devices_without_any_vulkan_driver_says_so():
    proc = cli("devices", env_extra={"VK_ICD_FILENAMES": "/nonexistent.json", "VK_DRIVER_FILES": "/nonexistent.json"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("vulkan"))
    assert "not available" in line and "no Vulkan device" in line


def test_run_on_vulkan_without_any_driver_exits_2_with_the_reason():
    proc = cli(
        "run",
        "Hi",
        "--backend",
        "vulkan",
        "--max-tokens",
        "1",
        env_extra={"VK_ICD_FILENAMES": "/nonexistent.json", "VK_DRIVER_FILES": "/nonexistent.json"},
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no Vulkan device" in proc.stderr


def test_perplexity_prints_ppl_last(tmp_path):
    text = tmp_path / "ppl_text_start.txt"  # the golden text's first ~500 tokens: 3 windows of 128 are scored
    text.write_text((GOLDENS / "ppl_text.txt").read_text()[:2000])
    proc = cli("perplexity", str(text), "--backend", "cpu", "--ctx", "128")
    assert proc.returncode == 0, proc.stderr
    *_, windows, last = proc.stdout.strip().splitlines()
    assert last.startswith("PPL = ")
    assert 1.0 < float(last.split("=")[1]) < 100.0
    assert " windows of 128 tokens, " in windows and windows.endswith("backend cpu")  # --ctx reached the scorer


def test_perplexity_of_missing_file_is_a_clean_error(tmp_path):
    proc = cli("perplexity", str(tmp_path / "nope.txt"), "--backend", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "nope.txt" in proc.stderr


def test_bench_streams_batches_each_count_and_times_the_scripted_chat():
    proc = cli(
        "bench",
        "--backend",
        "cpu",
        "--streams",
        "1,3",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "5",
        "--chat-turns",
        "3",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["slots"] == 3  # the model was loaded with one slot per stream of the largest count
    assert [p["streams"] for p in r["points"]] == [1, 3]
    assert [p["max_batch"] for p in r["points"]] == [1, 3]  # three streams shared decode steps
    assert all(p["aggregate_tok_s"] > 0 and p["itl_p99_ms"] >= p["itl_p50_ms"] > 0 for p in r["points"])
    # the scheduler's decode steps while all streams decoded: their rows, wall and backend time
    for p in r["points"]:
        assert p["window_steps"] >= 1 and 1 <= p["rows_per_step"] <= p["streams"]
        assert p["step_ms"] >= p["backend_ms"] > 0
    [chat] = r["chats"]
    assert len(chat["ttft_ms"]) == 3 and r["chat_turns"] == 3
    assert chat["reused"][0] == 0 and 0 < chat["reused"][1] < chat["reused"][2]  # each turn kept the last
    assert r["admission"] is None  # no --admit-tokens given


def test_bench_streams_admits_a_long_prompt_and_alternates_chats():
    proc = cli(
        "bench",
        "--backend",
        "cpu",
        "--streams",
        "2",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "24",
        "--admit-tokens",
        "300",
        "--alternate-chats",
        "2",
        "--chat-turns",
        "2",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["slots"] >= 3  # two streams, the admitted request's slot
    adm = r["admission"]
    assert adm["admit_tokens"] == 300 and adm["chunks"] >= 3  # prefilled in chunks ...
    assert adm["running_tokens"] > 0  # ... while the running streams went on
    chats = r["chats"]
    assert len(chats) == 2  # two scripted chats took turns, each kept its own history
    assert all(c["reused"][0] == 0 and c["reused"][1] > 0 for c in chats)


def test_bench_streams_refuses_a_bad_count():
    proc = cli("bench", "--backend", "cpu", "--streams", "2,0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--streams" in proc.stderr
