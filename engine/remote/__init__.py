"""Remote engines (issue 21): answers from a server that speaks the OpenAI protocol — vLLM,
llama.cpp's server, Ollama, LM Studio, another Phoenix Chat — for when the laptop is not enough.

Engine floor: nothing from app. `engine.py` holds RemoteEngine (and re-exports the types below);
`target.py` where it points (RemoteTarget); `deltas.py` what it streams (RemoteDelta,
RemoteUsage); `errors.py` RemoteError; `faults.py` the client's exceptions → one line;
`fields.py` SamplingParams → request fields, and the fields a server refused; `retry.py` the 429
waits; `reading.py` one SSE stream → deltas, with TTFT and tok/s on the client's clock.

Where this follows the contract's either/or, and what it adds:
- `stream_chat` / `stream_completion` never raise, also before the first byte: every fault is
  their final delta (finish "error", or "cut" once text had come), `error` one line.
  `models()`, `check()`, `resolved_model()` raise RemoteError; so does RemoteEngine() for a URL
  that is not http(s)://HOST.
- `resolved_model()` checks a named model against /v1/models (llama.cpp's server answers any
  name with its own model; a wrong name should fail at connect, not look like it worked).
- RemoteEngine(..., backoff_s=1.0): the first 429 wait when the server sends no Retry-After
  (then doubling); a Retry-After over 60 s is not waited for.
- RemoteUsage.counted_by_server: whether the token counts are the server's or ours.
- The extras go with the user's values also when "off" (top_k 0, min_p 0, penalty 1.0), and the
  penalty goes twice: `repetition_penalty` (vLLM, our server) and `repeat_penalty` (llama.cpp's
  name). A server's defaults are not ours: llama.cpp's server applies repeat_penalty 1.1, top_k
  40 and min_p 0.05 unless told, and its greedy answer then differs from ours (tested).
- `unsupported_fields` may also hold `repeat_penalty`, `seed`, `top_p`, `stream_options`.
"""
